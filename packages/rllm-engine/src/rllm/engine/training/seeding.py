"""What a training run's ``seed`` seeds, so that the same seed and config give the same run.

``seed`` = N seeds:
- the task order (``data_order``: a shuffle per epoch from ``N:epoch``);
- the backend (``backend.options.seed`` unless given: the tinker backend's ``torch.manual_seed``
  at load, and the tiny model's weights);
- this process's ``random`` module at a fresh start (a resumed run restores the checkpoint's);
- sampling: ``rollout.sampling.seed`` and ``rollout.val_sampling.seed`` default to N, and each
  step's rollouts sample from ``seed + step * STEP_STRIDE`` (``step_sampling``; the asynchronous
  loop gives each group the step the synchronous loop would draw it for, and the seed travels
  with each rollout to whichever worker runs it), which the engine makes one seed per (task,
  drawing, rollout) (``rllm.engine.rollout.rollout_config.rollout_sampling``; a task drawn again
  in the step, in its batch or a later round, has its own: ``drawing_sampling``) and the gateway
  one per call. So a task met again in a later epoch draws new samples, and
  validation draws the same ones every time. A sampler honours a request's seed with its own
  generator (the tinker local sampler), whatever else it batches the request with.

With these, two runs of the same config and seed on the same machine, local backend, one flow
worker (``rollout.workers = 1``) and the synchronous loop, give the same metrics row for row
(timings aside; ``tests/test_train_reproducible.py``). What stays nondeterministic:
- ``rollout.workers`` > 1: each worker's episodes reach the trainer in the order they finish, so
  a step's groups, and the order of the sums in its update, differ from run to run (the float
  rounding of the update differs, then the samples drawn from it);
- the asynchronous loop (``rollout.max_staleness`` > 0): which groups a step trains on, and on
  how stale weights they were sampled, depends on timing;
- a flow's own randomness (``random`` in worker processes or in concurrently running flows);
- GPU kernels that are nondeterministic (atomics in reductions), and a remote service's sampler.
"""

from __future__ import annotations

import random

import msgspec

from rllm.types import SamplingParams

STEP_STRIDE = 1_000_003  # a prime: steps' seeds never meet within 2**31 / STEP_STRIDE (~2,000) steps


def seeded(sampling: SamplingParams | None, seed: int) -> SamplingParams | None:
    """``sampling`` with ``seed`` where it names none (None stays None: validation then uses the
    training sampling, already seeded)."""
    if sampling is None or sampling.seed is not None:
        return sampling
    return msgspec.structs.replace(sampling, seed=seed)


def step_sampling(sampling: SamplingParams, step: int) -> SamplingParams:
    """The sampling of training step ``step``'s rollouts: its own seed, derived from the run's."""
    if sampling.seed is None:
        return sampling
    return msgspec.structs.replace(sampling, seed=(sampling.seed + step * STEP_STRIDE) % 2**31)


def seed_process(seed: int) -> None:
    """Seed this process's ``random`` module (a fresh run; a resumed one restores its checkpoint's)."""
    random.seed(seed)
