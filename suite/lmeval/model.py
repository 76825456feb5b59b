"""kvbench as an lm-eval model: ``--model kvbench`` evaluates lm-eval tasks under an eviction policy.

The class subclasses lm-eval's HFLM. It keeps HFLM's tokenization, truncation, chat templates and request
plumbing. It replaces the three request kinds with kvbench's own paths, so that the policy evicts under
the protocol's schedule, with the context protected as the protocol says:

- ``generate_until`` runs kvbench's decode loop. The samples of one request (lm-eval's ``repeats``)
  decode as one batch. Each sample has its own seed, the one `kvbench run` gives (task, doc, sample).
- ``loglikelihood`` and ``loglikelihood_rolling`` run kvbench's teacher-forced path, evicting on the
  same schedule while the continuation is scored.

Every request's eviction statistics are kept. ``get_model_info`` returns them, and lm-eval writes that
into its results' ``config`` (key ``kvbench``). lm-eval's request cache (``--use_cache``) is refused, so it
stores nothing for this model: its key holds the request, not the policy.
"""

from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from kvbench.adapters.base import Backend, Sampling, find_adapter
from kvbench.core.schedule import Schedule
from kvbench.core.seeding import sample_seed, stable_seed
from kvbench.errors import BudgetError, PrerequisiteError, SpecError
from kvbench.lmeval.settings import EvictionSettings
from kvbench.lmeval.tasks import task_sampling

logger = logging.getLogger(__name__)
SAMPLING_KEYS = {"do_sample", "temperature", "top_p", "top_k"}
"""The generation arguments kvbench's decode loop follows; any other is refused, never ignored."""


class KVBenchLM(HFLM):
    """An lm-eval model whose KV cache is kvbench's: model args as in :class:`EvictionSettings`."""

    def __init__(self, **model_args: Any) -> None:
        lm_eval_args = {k: model_args.pop(k) for k in ("batch_size", "max_batch_size") if k in model_args}
        max_length = model_args.pop("max_length", None)
        model_args["device"] = _device(model_args.get("device"))
        self.settings = EvictionSettings.from_model_args(model_args)
        if int(lm_eval_args.get("batch_size", 1) or 1) != 1:
            raise SpecError(
                "model kvbench: batch_size must be 1 (the samples of one request already decode as a batch)"
            )
        if self.settings.adapter != "hf":
            raise SpecError(
                f"model kvbench: adapter={self.settings.adapter!r} is not available inside lm-eval, which "
                "needs the transformers model of the hf adapter; run that adapter through `kvbench run` "
                "with an lm-eval task source instead"
            )
        # HFLM keeps "causal" or "seq2seq" in `self.backend`: kvbench's backend has its own name
        self.kv_backend: Backend = find_adapter(self.settings.adapter).load(
            self.settings.model_spec,
            device=self.settings.device,
            attention=self.settings.attention,
            progress=False,
        )
        loaded = self.kv_backend.loaded  # type: ignore[attr-defined]  # the hf adapter's backend
        super().__init__(pretrained=loaded.model, tokenizer=loaded.tokenizer, max_length=max_length)
        self.chat_template_args = dict(self.settings.model_spec.chat_template_args)
        self.policy = self.settings.policy_instance
        self.schedule: Schedule = self.settings.schedule()
        self._calibration: Any = None  # the model's query statistics, computed once if the policy needs them
        self.requests: list[dict[str, Any]] = []
        """One record per request: what it asked and what eviction did while it ran."""
        self._current: Any = None

    def set_cache_hook(self, cache_hook: Any) -> None:
        """lm-eval's CachingLM hooks itself in here; its answers would outlive the policy that gave them."""
        if cache_hook.dbdict is not None:
            raise SpecError(
                "model kvbench: lm-eval's --use_cache would store answers under a key that holds the request "
                "but not the policy, and give them back to a run of another policy: run without it"
            )
        super().set_cache_hook(cache_hook)

    def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
        """Each distinct request once, its repeats decoded as one batch; results in request order."""
        repeats = Counter(id(r) for r in requests)
        texts: dict[int, list[str]] = {}
        unique = list({id(r): r for r in requests}.values())
        for request in tqdm(unique, disable=disable_tqdm, desc="kvbench generate_until"):
            texts[id(request)] = self._generate(request, repeats[id(request)])
        return [texts[id(request)].pop(0) for request in requests]  # each repeat takes its own sample

    def _generate(self, request: Any, samples: int) -> list[str]:
        context, gen_kwargs = request.args
        kwargs = normalize_gen_kwargs(copy.deepcopy(gen_kwargs), self.max_gen_toks)
        eos = self.tok_decode(self.eot_token_id, skip_special_tokens=False)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_gen_toks = int(kwargs.pop("max_gen_toks"))
        sampling = _sampling(kwargs, request)
        context_ids, _ = self.tok_batch_encode(
            [context], left_truncate_len=self.max_length - max_gen_toks, truncation=self.truncation
        )
        prompt = context_ids[0].tolist()
        task, doc_id, _ = _key(request)
        seeds = [sample_seed(self.settings.protocol_spec.seed, task, doc_id, i) for i in range(samples)]
        started = time.perf_counter()
        with _naming(request):
            result = self.kv_backend.generate(
                prompt,
                self.policy,
                self.schedule,
                sample_seeds=seeds,
                sampling=sampling,
                max_new_tokens=max_gen_toks,
                calibration=self._calibration_stats(),
                refuse_capped_prompt=True,
                stop_strings=until,
            )
        texts = [
            postprocess_generated_text(self.tok_decode(s.tokens), stop=until, think_end_token=None)
            for s in result.samples
        ]
        self._record(
            request,
            "generate_until",
            prompt_tokens=len(prompt),
            samples=samples,
            seeds=seeds,
            generated_tokens=[s.generated for s in result.samples],
            finish_reasons=[s.finish_reason for s in result.samples],
            eviction_events=result.eviction_events,
            eviction_seconds=result.eviction_seconds,
            peak_kv_bytes=result.peak_kv_bytes,
            seconds=time.perf_counter() - started,
            sampling={"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": sampling.top_k},
        )
        return texts

    def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return self._one_by_one(super().loglikelihood, requests, disable_tqdm)

    def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
        return self._one_by_one(super().loglikelihood_rolling, requests, disable_tqdm)

    def _one_by_one(self, method: Callable[..., list], requests: list, disable_tqdm: bool) -> list:
        """HFLM's ``method`` on each request alone, which ``_loglikelihood_tokens`` names as it runs."""
        out: list = []
        for request in tqdm(requests, disable=disable_tqdm, desc=f"kvbench {method.__name__}"):
            self._current = request
            out.extend(method([request], disable_tqdm=True))
        return out

    def _loglikelihood_tokens(
        self, requests: list, disable_tqdm: bool = False, override_bs: int | None = None
    ) -> list[tuple[float, bool]]:
        """Each (context, continuation) scored by teacher forcing under the policy's schedule; as HFLM, a
        pair longer than the model's length keeps its last ``max_length + 1`` tokens."""
        out = []
        for window, (_, context_ids, continuation_ids) in enumerate(requests):
            if len(continuation_ids) > self.max_length:
                raise SpecError(
                    f"{_where(self._current)}: a continuation of {len(continuation_ids)} tokens does not fit "
                    f"the model's max_length {self.max_length}"
                )
            whole = (list(context_ids) + list(continuation_ids))[-(self.max_length + 1) :]
            prompt = whole[: len(whole) - len(continuation_ids)]
            started = time.perf_counter()
            seed = stable_seed(
                self.settings.protocol_spec.seed, "loglikelihood", *_key(self._current), window
            )
            with _naming(self._current):
                forced = self.kv_backend.teacher_force(
                    prompt,
                    list(continuation_ids),
                    self.policy,
                    self.schedule,
                    row_seeds=[seed],
                    calibration=self._calibration_stats(),
                    refuse_capped_prompt=True,
                )
            logprob = float(forced.logprobs[0].sum())
            greedy = bool(forced.greedy_match[0].all())
            out.append((logprob, greedy))
            self._record(
                self._current,
                self._current.request_type if self._current is not None else "loglikelihood",
                prompt_tokens=len(prompt),
                continuation_tokens=len(continuation_ids),
                window=window,
                seeds=[seed],
                eviction_events=forced.eviction_events,
                eviction_seconds=forced.eviction_seconds,
                peak_kv_bytes=forced.peak_kv_bytes,
                seconds=time.perf_counter() - started,
            )
        return out

    def get_model_info(self) -> dict[str, Any]:
        """The run's eviction settings and every request's statistics (lm-eval puts them in its results'
        ``config``); no hub lookup, unlike HFLM's."""
        model = self.kv_backend.loaded.model  # type: ignore[attr-defined]
        return {
            "model_num_parameters": sum(p.numel() for p in model.parameters()),
            "model_dtype": str(model.dtype),
            "model_revision": "",
            "model_sha": "",
            "kvbench": {
                **self.settings.record(self.schedule),
                "totals": {
                    "requests": len(self.requests),
                    "eviction_events": sum(r["eviction_events"] for r in self.requests),
                    "eviction_seconds": sum(r["eviction_seconds"] for r in self.requests),
                    "peak_kv_bytes": max((r["peak_kv_bytes"] for r in self.requests), default=0),
                },
                "requests": self.requests,
            },
        }

    def _calibration_stats(self) -> Any:
        if "calibration" in self.policy.needs and self._calibration is None:
            self._calibration = self.kv_backend.calibrate()
        return self._calibration

    def _record(self, request: Any, kind: str, **stats: Any) -> None:
        task, doc_id, index = _key(request)
        self.requests.append({"task": task, "doc_id": doc_id, "request_index": index, "kind": kind, **stats})


def _device(asked: str | None) -> str:
    """lm-eval's ``--device`` (default ``cuda:0``); as lm-eval's own HF model does, a CUDA device on a
    machine without one falls back to the CPU, and the device used is recorded."""
    import torch

    if asked is None or (asked.startswith("cuda") and not torch.cuda.is_available()):
        if asked is not None:
            logger.warning("model kvbench: %s is not available here; running on cpu", asked)
        return "cpu"
    return asked


def _key(request: Any) -> tuple[str, str, int]:
    """(task, doc id, request index) of an lm-eval Instance; a request built by hand has none."""
    if request is None:
        return "", "", 0
    doc_id = "" if request.doc_id is None else str(request.doc_id)
    return str(request.task_name or ""), doc_id, request.idx


def _where(request: Any) -> str:
    task, doc_id, index = _key(request)
    return f"task {task!r}, doc {doc_id}, request {index}" if task else "a request"


@contextmanager
def _naming(request: Any) -> Iterator[None]:
    """A refused budget names the request it refused (a long context under prompt protection)."""
    try:
        yield
    except BudgetError as exc:
        hint = "(or buffer=, or a protocol that protects less)"
        raise BudgetError(f"{_where(request)}: {exc} {hint}") from None


def _sampling(kwargs: dict[str, Any], request: Any) -> Sampling:
    unknown = sorted(set(kwargs) - SAMPLING_KEYS)
    if unknown:
        raise SpecError(
            f"{_where(request)}: generation argument(s) {', '.join(unknown)} are not followed by kvbench's "
            f"decode loop (it follows until, max_gen_toks, {', '.join(sorted(SAMPLING_KEYS))}); remove them "
            "with --gen_kwargs or the task's generation_kwargs"
        )
    return task_sampling(kwargs)


def register() -> None:
    """Make ``--model kvbench`` known to lm-eval in this process (lm-eval discovers no plugins).

    lm-eval imports its built-in models only into an empty registry, so they are imported first; the
    import of HFLM above has done that already, and registering twice is harmless.
    """
    try:
        import lm_eval.models  # noqa: F401  # built-ins before ours, or they vanish from the registry
        from lm_eval.api.registry import model_registry, register_model
    except ImportError as exc:  # pragma: no cover - lm-eval is a dependency
        raise PrerequisiteError(f"lm-eval is not installed ({exc}): pip install -e .") from None
    if "kvbench" not in model_registry:
        register_model("kvbench")(KVBenchLM)
