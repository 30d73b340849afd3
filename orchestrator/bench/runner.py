"""The benchmark procedure: health, warm-up, then for every concurrency level R repetitions of
(``/flush_cache``, send the prompt set, read ``/server_info``, compute metrics, report).

The sweep calls :func:`run_benchmark` as a library; ``on_repetition`` is where it reports each
repetition to Ray Tune, so ASHA can stop a hopeless trial before the last repetition. The
server's ``avg_spec_accept_length`` is read after warm-up and before and after each repetition.
Only where a flush was *seen* to clear a value (the reference engine) does the value after a
repetition count as that repetition's figure. Where a value survives a flush (SGLang keeps
lifetime totals), or no flush has yet been seen to clear one, it is reported only as
``accept_length_server_lifetime`` and used as a weaker cross-check (it must move towards the
per-request figure), never as the repetition's figure: a number that cannot be attributed to the
measured requests is not presented as one. When the first repetition's flush met no value (no
warm-up on a fresh server), the idle server is flushed once more after it to find out.

Failed requests are counted, never fatal. What ends a run is a server that cannot serve at all:
unhealthy before the start (:class:`BenchmarkError`), or, once started, every warm-up request
failing, an engine that looks hung (requests time out in a row with none completing, see
:func:`~orchestrator.bench.loadgen.run_load`), or failing its health check after a repetition
lost requests to connection errors. Those raise :class:`~orchestrator.bench.report.BenchmarkAborted`
carrying what was measured until then (status ``failed``, where and why), so the repetitions that
finished are not lost with the engine.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Literal

import aiohttp

from orchestrator.bench import server as srv
from orchestrator.bench.datasets import Prompt, load_prompts
from orchestrator.bench.loadgen import ApiKind, LoadResult, RequestRecord, Sampling, WorkItem, run_load
from orchestrator.bench.metrics import RepetitionMetrics, compute_repetition_metrics, error_counts
from orchestrator.bench.report import (
    BenchFailure,
    BenchmarkAborted,
    BenchResult,
    DatasetInfo,
    LevelResult,
    WarmupInfo,
    summarise_level,
)
from orchestrator.bench.settings import BenchSettings
from orchestrator.errors import BenchmarkError

__all__ = ["ProgressUpdate", "arun_benchmark", "run_benchmark"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProgressUpdate:
    """Sent after every finished request, for progress bars."""

    phase: Literal["warmup", "measure"]
    concurrency: int
    repetition: int
    done: int
    total: int


RepetitionCallback = Callable[[RepetitionMetrics], None]
ProgressCallback = Callable[[ProgressUpdate], None]


def run_benchmark(
    *,
    base_url: str,
    settings: BenchSettings,
    on_repetition: RepetitionCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> BenchResult:
    """Benchmark the server at ``base_url``; blocking (runs its own event loop).

    Args:
        base_url: ``http://host:port`` of a running, healthy server.
        settings: What to send and how often (``BenchSettings.from_spec(spec.benchmark)``).
        on_repetition: Called after each (concurrency, repetition) with that repetition's metrics;
            exceptions it raises propagate (a callback may stop the run that way).
        on_progress: Called after each request, for progress display.

    Returns:
        The result, with per-repetition metrics, their summary and the
        ``accept_length_mismatch`` / ``noisy`` flags.

    Raises:
        BenchmarkAborted: the server failed once the run had started (every warm-up request
            failed, it looks hung, or it died mid-run); ``partial`` holds what was measured.
        BenchmarkError: the server cannot serve at the start (unreachable, unhealthy), or the
            dataset cannot be read (``DatasetError``, a subclass).
    """
    return asyncio.run(
        arun_benchmark(base_url=base_url, settings=settings, on_repetition=on_repetition, on_progress=on_progress)
    )


async def _ensure_healthy(session: aiohttp.ClientSession, base_url: str, timeout_s: float, when: str) -> None:
    reason = await srv.check_health(session, base_url, timeout_s=timeout_s)
    if reason is not None:
        raise BenchmarkError(f"{when}: {reason}")


def _items(prompts: list[Prompt]) -> list[WorkItem]:
    return [WorkItem(prompt_id=p.id, text=p.text) for p in prompts]


@dataclass
class _Measured:
    """What a run has measured so far: all that its result, complete or partial, is built from."""

    base_url: str
    settings: BenchSettings
    prompts: list[Prompt]
    api: ApiKind
    model: str | None
    info: dict[str, Any] | None
    flush_supported: bool
    warmup: WarmupInfo = field(default_factory=lambda: WarmupInfo(num_requests=0, num_errors=0, errors_by_kind={}))
    scopes: set[str] = field(default_factory=set)
    levels: list[LevelResult] = field(default_factory=list)
    running: list[RepetitionMetrics] = field(default_factory=list)
    """The finished repetitions of the level now running."""

    def _level(self, concurrency: int, repetitions: list[RepetitionMetrics]) -> LevelResult:
        return summarise_level(
            concurrency=concurrency,
            request_rate=self.settings.request_rate,
            repetitions=repetitions,
            noise_metrics=self.settings.noise_metrics,
            noisy_cv_threshold=self.settings.noisy_cv_threshold,
        )

    def finish_level(self, concurrency: int) -> LevelResult:
        level = self._level(concurrency, self.running)
        self.levels.append(level)
        self.running = []
        return level

    def aborted(
        self, reason: str, *, concurrency: int | None = None, repetition: int | None = None,
        metrics: RepetitionMetrics | None = None,
    ) -> BenchmarkAborted:
        """The error that ends the run here, carrying what was measured up to now."""
        failure = BenchFailure(
            phase="warmup" if concurrency is None else "measure", concurrency=concurrency, repetition=repetition,
            reason=reason, repetition_metrics=metrics,
        )
        return BenchmarkAborted(self.result(failure))

    def result(self, failure: BenchFailure | None = None) -> BenchResult:
        """The result: every finished level, and for a failed run also the running level's finished repetitions."""
        levels = list(self.levels)
        if failure is not None and failure.concurrency is not None and self.running:
            levels.append(self._level(failure.concurrency, self.running))
        scopes, prompts = self.scopes, self.prompts
        return BenchResult(
            status="ok" if failure is None else "failed",
            failure=failure,
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            base_url=self.base_url,
            api=self.api,
            model=self.model,
            server=srv.summarise_server_info(self.info),
            flush_cache_supported=self.flush_supported,
            server_accept_length_scope="lifetime" if "lifetime" in scopes else ("repetition" if scopes else None),
            settings=self.settings,
            dataset=DatasetInfo(
                name=self.settings.dataset,
                path=self.settings.dataset_path,
                num_prompts=len(prompts),
                distinct_prompts=len({p.id for p in prompts}),
                mean_prompt_chars=sum(len(p.text) for p in prompts) / len(prompts),
            ),
            warmup=self.warmup,
            levels=levels,
            num_requests=sum(rep.num_requests for level in levels for rep in level.repetitions),
            num_errors=sum(level.num_errors for level in levels),
            accept_length_mismatch=any(level.accept_length_mismatch for level in levels),
            accept_length_not_checkable=any(level.accept_length_not_checkable for level in levels),
            noisy=any(level.noisy for level in levels),
        )


async def arun_benchmark(
    *,
    base_url: str,
    settings: BenchSettings,
    on_repetition: RepetitionCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> BenchResult:
    """:func:`run_benchmark` for callers that already run an event loop."""
    base_url = base_url.rstrip("/")
    prompts = load_prompts(
        dataset=settings.dataset,
        count=settings.num_prompts,
        seed=settings.seed,
        dataset_path=settings.dataset_path,
        random_input_len=settings.random_input_len,
    )
    sampling = Sampling(
        max_new_tokens=settings.output_len,
        temperature=settings.temperature,
        seed=settings.seed,
        ignore_eos=settings.ignore_eos,
    )
    health_timeout_s = min(settings.request_timeout_s, 120.0)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await _ensure_healthy(session, base_url, health_timeout_s, "cannot benchmark")
        api: ApiKind
        if settings.api == "auto":
            api, info = await srv.detect_api(session, base_url)
        else:
            api, info = settings.api, await srv.get_server_info(session, base_url)
        model = settings.model
        if api != "generate" and model is None:
            model = await srv.openai_model(session, base_url)
        logger.info(
            "benchmarking %s: api=%s model=%s dataset=%s prompts=%d output_len=%d concurrency=%s "
            "repetitions=%d warmup=%d temperature=%g seed=%d%s",
            base_url, api, model or "-", settings.dataset, settings.num_prompts, settings.output_len,
            settings.concurrency, settings.repetitions, settings.warmup_requests, settings.temperature,
            settings.seed, f" request_rate={settings.request_rate:g}/s" if settings.request_rate else "",
        )
        run = _Measured(
            base_url=base_url, settings=settings, prompts=prompts, api=api, model=model, info=info,
            flush_supported=settings.flush_cache and info is not None,
        )

        async def load(items: list[WorkItem], concurrency: int, progress: Callable[[RequestRecord], None]) -> LoadResult:
            return await run_load(
                session=session, base_url=base_url, api=api, items=items, concurrency=concurrency,
                sampling=sampling, timeout_s=settings.request_timeout_s, stream=settings.stream, model=model,
                request_rate=settings.request_rate, seed=settings.seed, hang_limit=settings.hung_after_timeouts,
                on_record=progress,
            )

        def progress_for(phase: Literal["warmup", "measure"], concurrency: int, repetition: int, total: int):
            done = 0

            def note(record: RequestRecord) -> None:
                nonlocal done
                done += 1
                if on_progress is not None:
                    on_progress(ProgressUpdate(phase, concurrency, repetition, done, total))

            return note

        async def read_accept_length() -> float | None:
            return srv.accept_length_from_info(await srv.get_server_info(session, base_url))

        async def flush() -> bool:
            """Flush the idle server; the first failure is logged once and ends flushing for this run."""
            reason = await srv.flush_cache(session, base_url, timeout_s=health_timeout_s)
            if reason is not None:
                logger.warning("/flush_cache failed, not calling it again in this run: %s", reason)
                run.flush_supported = False
            return reason is None

        if settings.warmup_requests:
            items = _items([prompts[i % len(prompts)] for i in range(settings.warmup_requests)])
            concurrency = min(max(settings.concurrency), len(items))
            result = await load(items, concurrency, progress_for("warmup", concurrency, 0, len(items)))
            failed = [r for r in result.records if r.error is not None]
            run.warmup = WarmupInfo(
                num_requests=len(items), num_errors=len(failed), errors_by_kind=error_counts(result.records)
            )
            if result.hung is not None:
                raise run.aborted(
                    f"warm-up stopped: {result.hung} ({run.warmup.errors_by_kind}); is the engine stuck? "
                    "its log should say where"
                )
            if len(failed) == len(items):
                raise run.aborted(
                    f"every warm-up request to {base_url} failed ({run.warmup.errors_by_kind}); "
                    f"first: {failed[0].error_kind}: {failed[0].error}"
                )
            if failed:
                logger.warning("%d of %d warm-up requests failed: %s", len(failed), len(items), run.warmup.errors_by_kind)

        items = _items(prompts)
        update_interval = srv.decode_log_interval_from_info(info)
        counters = _FlushEvidence()
        last = await read_accept_length() if info is not None else None  # the value the next flush meets
        for concurrency in settings.concurrency:
            for repetition in range(settings.repetitions):
                flushed = await flush() if run.flush_supported else False
                before = after = None
                if info is not None:
                    before = await read_accept_length()
                    if flushed:
                        counters.saw_flush(value_before=last, value_after=before)
                result = await load(
                    items, concurrency, progress_for("measure", concurrency, repetition, len(items))
                )
                if info is not None:
                    after = last = await read_accept_length()
                    if flushed and before is None and after is not None and not counters.decided and run.flush_supported:
                        # Nothing was counted when this repetition's flush ran, so it showed nothing about
                        # what a flush does to the counters: flush the idle server once more and look.
                        if await flush():
                            last = await read_accept_length()
                            counters.saw_flush(value_before=after, value_after=last)
                # Only a flush seen to clear the counters makes the value after this repetition's figure;
                # otherwise it is a lifetime mean (SGLang): a weaker cross-check, never the figure itself.
                reset = flushed and before is None and counters.resets
                if after is not None:
                    scope = "repetition" if reset else "lifetime"
                    if scope == "lifetime" and "lifetime" not in run.scopes:
                        logger.info(
                            "the server's avg_spec_accept_length is a lifetime mean (not shown to be reset by "
                            "/flush_cache); accept_length comes from the per-request meta_info, the server's value "
                            "is a cross-check"
                        )
                    run.scopes.add(scope)
                metrics = compute_repetition_metrics(
                    records=result.records,
                    duration_s=result.duration_s,
                    concurrency=concurrency,
                    repetition=repetition,
                    request_rate=settings.request_rate,
                    accept_length_server=after,
                    accept_length_server_before=before,
                    server_counters_reset=reset,
                    server_update_interval=update_interval,
                    accept_length_tolerance=settings.accept_length_tolerance,
                )
                if result.hung is not None:
                    raise run.aborted(
                        f"stopped during concurrency {concurrency}, repetition {repetition}: {result.hung} "
                        f"({metrics.num_ok} of {metrics.num_requests} requests completed: {metrics.errors_by_kind}); "
                        "is the engine stuck? its log should say where",
                        concurrency=concurrency, repetition=repetition, metrics=metrics,
                    )
                if metrics.num_errors and (
                    {"connection", "not_sent"} & set(metrics.errors_by_kind) or metrics.num_ok == 0
                ):
                    reason = await srv.check_health(session, base_url, timeout_s=health_timeout_s)
                    if reason is not None:
                        raise run.aborted(
                            f"the server stopped serving during concurrency {concurrency}, repetition {repetition} "
                            f"({metrics.num_errors} of {metrics.num_requests} requests failed: "
                            f"{metrics.errors_by_kind}): {reason}",
                            concurrency=concurrency, repetition=repetition, metrics=metrics,
                        )
                _log_repetition(metrics)
                run.running.append(metrics)
                if on_repetition is not None:
                    on_repetition(metrics)
            level = run.finish_level(concurrency)
            if level.noisy:
                logger.warning("concurrency %d is noisy: %s", concurrency, ", ".join(level.noisy_metrics))
        return run.result()


@dataclass
class _FlushEvidence:
    """What ``/flush_cache`` was seen to do to the server's accept-length counters.

    A flush proves something only when a value was there before it: gone afterwards means the
    counters reset (the reference engine); still there means lifetime totals (SGLang). Per-repetition
    figures need a reset seen and no survival seen, ever.
    """

    reset_seen: bool = False
    survival_seen: bool = False

    def saw_flush(self, *, value_before: float | None, value_after: float | None) -> None:
        if value_before is None:
            return
        if value_after is None:
            self.reset_seen = True
        else:
            self.survival_seen = True

    @property
    def decided(self) -> bool:
        return self.reset_seen or self.survival_seen

    @property
    def resets(self) -> bool:
        return self.reset_seen and not self.survival_seen


def _log_repetition(metrics: RepetitionMetrics) -> None:
    def fmt(value: float | None, digits: int = 1) -> str:
        return "absent" if value is None else f"{value:.{digits}f}"

    logger.info(
        "concurrency %d rep %d: %s tok/s, TTFT p50 %s ms, TPOT p50 %s ms, accept_length %s (server %s), "
        "tok/chunk %s, errors %d",
        metrics.concurrency, metrics.repetition, fmt(metrics.output_tok_per_s), fmt(metrics.ttft_ms.median),
        fmt(metrics.tpot_ms.median, 2), fmt(metrics.accept_length, 2), fmt(metrics.accept_length_server, 2),
        fmt(metrics.tokens_per_chunk, 2), metrics.num_errors,
    )
    if metrics.accept_length_mismatch:
        server = metrics.accept_length_server
        logger.warning(
            "concurrency %d rep %d: accept_length_mismatch: server %.3f%s vs per-request %.3f",
            metrics.concurrency, metrics.repetition,
            server if server is not None else metrics.accept_length_server_lifetime,
            "" if server is not None else " (lifetime mean)", metrics.accept_length_requests,
        )
    if metrics.accept_length_check == "not_checkable":
        logger.warning(
            "concurrency %d rep %d: accept length not checkable: the server's lifetime mean %.3f did not move towards "
            "the per-request %.3f, and the repetition may have been too short for the server to fold its counters",
            metrics.concurrency, metrics.repetition, metrics.accept_length_server_lifetime,
            metrics.accept_length_requests,
        )
    if metrics.num_errors:
        logger.warning(
            "concurrency %d rep %d: %d of %d requests failed %s; first: %s",
            metrics.concurrency, metrics.repetition, metrics.num_errors, metrics.num_requests,
            metrics.errors_by_kind, metrics.error_samples[0] if metrics.error_samples else "-",
        )
