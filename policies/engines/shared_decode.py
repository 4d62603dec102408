"""Generation for a batch whose prompts are mostly the same tokens: held-out scoring's k samples of an entry, and
one suite's system prompt and tool documents in every prompt.

`model.generate` prefills every row in full (the k copies of a prompt k times) and decodes every row until the
last one ends. Here each distinct prompt is prefilled once, after the prefix that all of them share (prefilled
once for all), the key-value cache is copied to the rows that repeat it, and a row leaves the batch as soon as it
ends (its stop token or its own budget), so the steps after it cost only the rows still going. The cache is laid
out [shared prefix][padding][rest of the prompt]; the attention mask hides the padding and positions count real
tokens only, as `generate` counts them under left padding.

Each step draws from what `generate` draws from: the last position's logits in float32, divided by the
temperature, cut to the top-p nucleus, softmax, one multinomial draw (`draw`, without sorting the whole vocabulary
each step as `generate` does); greedy takes the argmax. The random draws fall differently, so sampled results are
the same in distribution, not token for token; greedy results are the same tokens (tests/unit/test_shared_decode.py).
"""

from __future__ import annotations


def common_prefix(rows: list[list[int]]) -> int:
    """Length of the token prefix all rows share, leaving at least one token of each to run after it."""
    n = min(len(r) for r in rows) - 1
    first = rows[0]
    for r in rows[1:]:
        i = 0
        while i < n and r[i] == first[i]:
            i += 1
        n = i
    return max(0, n)


def draw(torch, logits, temperature: float, top_p: float, candidates: tuple[int, ...] = (256, 4096)):
    """One token per row from softmax(logits / temperature) cut to its top-p nucleus, as `generate` draws (its
    `TopPLogitsWarper`: a token is kept when the tokens more likely than it hold less than `top_p`). `generate` sorts
    the whole vocabulary every step for that; here a row's nucleus is looked for among its 256 most likely tokens,
    then its 4096, and only a row whose nucleus is wider still takes the whole-vocabulary way."""
    if temperature != 1.0:
        logits = logits / temperature
    if top_p >= 1.0:
        return torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1).squeeze(1)
    nxt = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    rows = torch.arange(logits.shape[0], device=logits.device)  # the rows not drawn yet
    norm = torch.logsumexp(logits, dim=-1, keepdim=True)
    for k in candidates:
        if k >= logits.shape[-1] or not len(rows):
            break
        top, ids = torch.topk(logits[rows], k, dim=-1)  # most likely first
        p = torch.exp(top - norm[rows])
        above = p.cumsum(dim=-1) - p  # the mass of the tokens more likely than each
        within = p.sum(dim=-1) >= top_p  # the nucleus lies within these k: every token after them is cut
        w = top[within].masked_fill(above[within] >= top_p, float("-inf"))
        nxt[rows[within]] = ids[within].gather(1, torch.multinomial(torch.softmax(w, dim=-1), 1)).squeeze(1)
        rows = rows[~within]
    if len(rows):
        from transformers.generation.logits_process import TopPLogitsWarper

        whole = TopPLogitsWarper(top_p=top_p)(None, logits[rows])
        nxt[rows] = torch.multinomial(torch.softmax(whole, dim=-1), num_samples=1).squeeze(1)
    return nxt


def prefill(model, torch, prompts: list[list[int]], pad_id: int, device):
    """Run distinct prompts into one cache: (cache, last-position logits, attention mask, next positions)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    shared = common_prefix(prompts)
    if shared:
        model(
            input_ids=torch.tensor([prompts[0][:shared]], device=device), past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        if len(prompts) > 1:
            cache.batch_repeat_interleave(len(prompts))
    rest = [p[shared:] for p in prompts]
    width = max(map(len, rest))
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rest], device=device)
    mask = torch.tensor([[1] * shared + [0] * (width - len(r)) + [1] * len(r) for r in rest], device=device)
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=pos[:, shared:], past_key_values=cache, use_cache=True, logits_to_keep=1
    )
    return cache, out.logits[:, -1, :].float(), mask, pos[:, -1] + 1


def decode(
    model,
    torch,
    prompts: list[list[int]],
    max_new: list[int],
    temperature: float,
    top_p: float,
    stops: tuple[int, ...],
    pad_id: int,
    device,
) -> list[list[int]]:
    """New token ids per row (a row's stop token, when it made one, last); rows may repeat prompts."""
    distinct = list(dict.fromkeys(map(tuple, prompts)))
    index = {p: i for i, p in enumerate(distinct)}
    cache, logits, mask, pos = prefill(model, torch, [list(p) for p in distinct], pad_id, device)
    rows = torch.tensor([index[tuple(p)] for p in prompts], device=device)
    if len(distinct) != len(prompts):  # rows that repeat a prompt get copies of its cache
        cache.reorder_cache(rows)
    logits, mask, pos = logits[rows], mask[rows], pos[rows]
    sample = temperature is not None and temperature > 0
    out: list[list[int]] = [[] for _ in prompts]
    alive = list(range(len(prompts)))  # the rows still generating, in the order of the batch's rows
    while alive:
        nxt = draw(torch, logits, float(temperature), float(top_p)) if sample else torch.argmax(logits, dim=-1)
        keep = []
        for j, (i, t) in enumerate(zip(alive, nxt.tolist())):
            out[i].append(t)
            if t not in stops and len(out[i]) < max_new[i]:
                keep.append(j)
        if not keep:
            break
        if len(keep) < len(alive):  # the finished rows leave the batch and its cache
            sel = torch.tensor(keep, device=device)
            cache.batch_select_indices(sel)
            nxt, mask, pos = nxt[sel], mask[sel], pos[sel]
            alive = [alive[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones((len(alive), 1))], dim=-1)
        res = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=pos[:, None], past_key_values=cache, use_cache=True)
        logits, pos = res.logits[:, -1, :].float(), pos + 1
    return out
