"""The KL and drift reference of full fine-tuning: the base model, or the weights of the last reference reset.

The trainer's KL term (`learner.kl_coef`) and the drift the step size follows (`policies/learning/step_size.py`) are
measured against it. With `learner.ref_reset_after` the learner moves it to the weights being trained once the step
size has sat at its floor (`take`: a copy of the model in memory, exact), after that step's export. The next step's
checkpoint names its version, and a resumed trainer loads that version's stored file when it first needs the reference
(`restore`); a restart before that checkpoint resumes with the reference before, and the count of steps at the floor
starts again. The weights store keeps a file that a kept manifest names as its `reference` (`WeightsStore.prune`);
should it be gone all the same, the base is the reference again, with a warning. Under LoRA there is no copy: the
reference is the model with its adapters off, i.e. the version its frozen base holds (`Trainer.rebase_reference`).
"""

from __future__ import annotations

from typing import Callable

import structlog

from policies.weights.model_store import BASE_VERSION


class Reference:
    def __init__(self, load: Callable, weights: Callable[[str], dict]):
        self._load, self._weights = load, weights  # a fresh copy of the base model; a stored version's tensors
        self.version = BASE_VERSION
        self._model, self._holds = None, None  # loaded on first use; the version its weights are

    def take(self, model, version: str) -> None:
        """The weights of `model` (being trained, named `version`) become the reference."""
        if self._model is None:
            self._model = self._load().eval()
        self._model.load_state_dict(model.state_dict())
        self.version = self._holds = version

    def restore(self, version: str) -> None:
        """A checkpoint's reference: loaded on first use."""
        self.version = version

    def model(self):
        if self._model is None:
            self._model, self._holds = self._load().eval(), BASE_VERSION
        if self._holds != self.version:
            try:
                src = self._load().state_dict() if self.version == BASE_VERSION else self._weights(self.version)
            except FileNotFoundError as exc:
                structlog.get_logger().warning("learner.reference_missing", reference=self.version, error=str(exc)[:200])
                self.version = BASE_VERSION
                src = self._load().state_dict()
            self._model.load_state_dict({k: v.to(self._model.dtype) for k, v in src.items()}, strict=False)
            self._holds = self.version
        return self._model
