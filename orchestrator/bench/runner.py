"""The benchmark procedure, as steps a caller can run one by one.

:func:`open_benchmark` connects and yields a :class:`BenchRun`; :func:`run_level` measures one
concurrency level on it (:func:`warm_up_level`, then :func:`run_repetition` until
``noise.repetition_verdict`` says stop); :func:`run_benchmark` composes the steps over every level
for the sweep and ``spectune bench``. Failed requests are counted, never fatal; a server that
cannot serve at all raises :class:`~orchestrator.bench.report.BenchmarkAborted` carrying what was
measured. How the server's accept length is attributed is in docs/design/bench-and-spec.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Literal

import aiohttp

from orchestrator.bench import control as srv
from orchestrator.bench.datasets import Prompt
from orchestrator.bench.request_log import load_dataset
from orchestrator.bench.host_cpu import read_cpu_times, steal_fraction
from orchestrator.bench.loadgen import ApiKind, LoadResult, RequestRecord, Sampling, WorkItem, run_load
from orchestrator.bench.metrics import (
    METRICS,
    RepetitionMetrics,
    compute_repetition_metrics,
    error_counts,
    output_tok_per_s,
)
from orchestrator.bench.noise import repetition_verdict, windows_stable
from orchestrator.bench.report import (
    BenchFailure,
    BenchmarkAborted,
    BenchResult,
    DatasetInfo,
    LevelResult,
    LevelWarmup,
    WarmupInfo,
    summarise_level,
)
from orchestrator.bench.settings import BenchSettings
from orchestrator.errors import BenchmarkError
from orchestrator.timestamps import utc_timestamp

__all__ = [
    "BenchRun",
    "ProgressUpdate",
    "arun_benchmark",
    "open_benchmark",
    "run_benchmark",
    "run_level",
    "run_repetition",
    "warm_up_level",
]

logger = logging.getLogger(__name__)

Phase = Literal["warmup", "measure"]


@dataclass(frozen=True)
class ProgressUpdate:
    """Sent after every finished request, for progress bars.

    ``repetition`` is the repetition (measure) or the warm-up batch (0 for ``warmup_requests``,
    1, 2, ... for the stability windows); ``total`` is the batch's size.
    """

    phase: Phase
    concurrency: int
    repetition: int
    done: int
    total: int


RepetitionCallback = Callable[[RepetitionMetrics], None]
ProgressCallback = Callable[[ProgressUpdate], None]


async def arun_benchmark(
    *,
    base_url: str,
    settings: BenchSettings,
    on_repetition: RepetitionCallback | None = None,
    on_progress: ProgressCallback | None = None,
) -> BenchResult:
    """Benchmark the server at ``base_url``: every level, in order.

    Args:
        base_url: ``http://host:port`` of a running, healthy server.
        settings: What to send and how often (``BenchSettings.from_spec(spec.benchmark)``).
        on_repetition: Called after each measured (concurrency, repetition), exactly once, with that
            repetition's metrics; exceptions it raises propagate (a callback may stop the run that way).
        on_progress: Called after each request, for progress display.

    Returns:
        The result: per-repetition metrics, each level's summary and warm-up, and its flags.

    Raises:
        BenchmarkAborted: the server failed once the run had started (every request of a warm-up
            batch failed, it looks hung, or it died mid-run); ``partial`` holds what was measured.
        BenchmarkError: the server cannot serve at the start (unreachable, unhealthy), or the
            dataset cannot be read (``DatasetError``, a subclass).
    """
    async with open_benchmark(base_url=base_url, settings=settings, on_progress=on_progress) as run:
        for concurrency in settings.concurrency:
            await run_level(run, concurrency=concurrency, on_repetition=on_repetition)
        return run.result()


def run_benchmark(**kwargs: Any) -> BenchResult:
    """:func:`arun_benchmark` run to completion in a new event loop (same arguments, result, errors)."""
    return asyncio.run(arun_benchmark(**kwargs))


@contextlib.asynccontextmanager
async def open_benchmark(
    *, base_url: str, settings: BenchSettings, on_progress: ProgressCallback | None = None
) -> AsyncIterator["BenchRun"]:
    """Read the prompts, connect, check health and find the API: the :class:`BenchRun` every step takes.

    Raises:
        BenchmarkError: the server is unreachable or unhealthy; ``DatasetError`` (a subclass) when
            the dataset cannot be read.
    """
    base_url = base_url.rstrip("/")
    prompts = load_dataset(
        dataset=settings.dataset,
        count=settings.num_prompts,
        seed=settings.seed,
        dataset_path=settings.dataset_path,
        random_input_len=settings.random_input_len,
    )
    health_timeout_s = _health_timeout_s(settings)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        reason = await srv.check_health(session, base_url, timeout_s=health_timeout_s)
        if reason is not None:
            raise BenchmarkError(f"cannot benchmark: {reason}")
        api: ApiKind
        if settings.api == "auto":
            api, info = await srv.detect_api(session, base_url)
        else:
            api, info = settings.api, await srv.get_server_info(session, base_url)
        model = settings.model
        if api != "generate" and model is None:
            model = await srv.openai_model(session, base_url)
        _log_settings(base_url, api, model, settings)
        yield BenchRun(
            session=session, base_url=base_url, settings=settings, prompts=prompts, api=api, model=model, info=info,
            on_progress=on_progress, flush_supported=settings.flush_cache and info is not None,
        )


def _health_timeout_s(settings: BenchSettings) -> float:
    return min(settings.request_timeout_s, 120.0)


def _log_settings(base_url: str, api: str, model: str | None, settings: BenchSettings) -> None:
    fewest, most = settings.repetition_bounds()
    warmup = settings.warmup
    logger.info(
        "benchmarking %s: api=%s model=%s dataset=%s prompts=%d output_len=%d concurrency=%s repetitions=%s "
        "(target: %s 95%% interval within %s of the geometric mean) warmup=%d per level%s temperature=%g seed=%d%s",
        base_url, api, model or "-", settings.dataset, settings.num_prompts, settings.output_len,
        settings.concurrency, most if fewest == most else f"{fewest}-{most}", settings.target_metric,
        "-" if settings.target_ci_rel is None else f"{settings.target_ci_rel:.1%}", settings.warmup_requests,
        "" if warmup.tolerance is None or not settings.warmup_requests
        else f" then windows until tok/s is stable within {warmup.tolerance:.0%} (at most {warmup.max_windows})",
        settings.temperature, settings.seed,
        f" request_rate={settings.request_rate:g}/s" if settings.request_rate else "",
    )


def _items(prompts: list[Prompt], count: int) -> list[WorkItem]:
    """``count`` requests cycling through ``prompts`` from the first."""
    return [WorkItem(prompt_id=p.id, text=p.text, messages=p.messages, max_tokens=p.max_tokens,
                     temperature=p.temperature, top_p=p.top_p)
            for p in (prompts[i % len(prompts)] for i in range(count))]


@dataclass
class _WarmupTally:
    """One level's warm-up as it goes, kept where an abort can see it; :meth:`info` is its record."""

    started_s: float = field(default_factory=time.perf_counter)
    duration_s: float | None = None
    """Set by :meth:`finish`; until then the time since the start (a warm-up that was cut short)."""
    window_requests: int | None = None
    num_requests: int = 0
    errors: Counter = field(default_factory=Counter)
    window_tok_per_s: list[float | None] = field(default_factory=list)
    converged: bool | None = None
    last_rate_rps: float | None = None
    """Successful requests per second of the last warm-up batch: what sizes the first repetition."""

    def add(self, result: LoadResult) -> None:
        self.num_requests += len(result.records)
        self.errors.update(error_counts(result.records))

    def finish(self) -> LevelWarmup:
        self.duration_s = time.perf_counter() - self.started_s
        return self.info()

    def info(self) -> LevelWarmup:
        duration_s = self.duration_s if self.duration_s is not None else time.perf_counter() - self.started_s
        return LevelWarmup(
            num_requests=self.num_requests, num_errors=sum(self.errors.values()),
            errors_by_kind=dict(sorted(self.errors.items())), duration_s=duration_s,
            window_requests=self.window_requests, window_tok_per_s=list(self.window_tok_per_s),
            converged=self.converged,
        )


@dataclass
class _Measured:
    """What a run has measured so far: all that its result, complete or partial, is built from."""

    levels: list[LevelResult] = field(default_factory=list)
    warmups: list[LevelWarmup] = field(default_factory=list)
    """The warm-ups of the finished levels."""
    scopes: set[str] = field(default_factory=set)
    running: list[RepetitionMetrics] = field(default_factory=list)
    """The finished repetitions of the level now running."""
    running_warmup: _WarmupTally | None = None
    """The warm-up of the level now running."""

    def _keep_warmup(self) -> None:
        """A warm-up run on its own (not followed by its level's repetitions) still counts in the total."""
        if self.running_warmup is not None:
            self.warmups.append(self.running_warmup.info())
            self.running_warmup = None

    def begin_level(self) -> None:
        self._keep_warmup()
        self.running = []

    def new_warmup(self) -> _WarmupTally:
        self._keep_warmup()
        self.running_warmup = _WarmupTally()
        return self.running_warmup

    def warmup_total(self) -> WarmupInfo:
        """Every level's warm-up added up, the running level's included (its failures end runs)."""
        parts = [*self.warmups, *([self.running_warmup.info()] if self.running_warmup else [])]
        kinds: Counter = Counter()
        for part in parts:
            kinds.update(part.errors_by_kind)
        return WarmupInfo(
            num_requests=sum(p.num_requests for p in parts), num_errors=sum(p.num_errors for p in parts),
            errors_by_kind=dict(sorted(kinds.items())), duration_s=sum(p.duration_s or 0.0 for p in parts),
        )


@dataclass
class _FlushEvidence:
    """What ``/flush_cache`` was seen to do to the server's accept-length counters (reset or survive)."""

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


@dataclass
class BenchRun:
    """One benchmark of one server in progress: the connection, what was found at the start, and
    what has been measured. Made by :func:`open_benchmark`; every step takes it, and
    :meth:`result` turns it into the :class:`BenchResult` at any point."""

    session: aiohttp.ClientSession
    base_url: str
    settings: BenchSettings
    prompts: list[Prompt]
    api: ApiKind
    model: str | None
    info: dict | None
    """``/server_info`` at the start; None for a server without SGLang's native endpoints."""
    on_progress: ProgressCallback | None
    flush_supported: bool
    counters: _FlushEvidence = field(default_factory=_FlushEvidence)
    measured: _Measured = field(default_factory=_Measured)

    async def load(self, items: list[WorkItem], *, concurrency: int, phase: Phase, batch: int) -> LoadResult:
        """Send ``items`` at ``concurrency`` (capped at their number), reporting progress per request."""
        s = self.settings
        done = 0

        def note(record: RequestRecord) -> None:
            nonlocal done
            done += 1
            if self.on_progress is not None:
                self.on_progress(ProgressUpdate(phase, concurrency, batch, done, len(items)))

        return await run_load(
            session=self.session, base_url=self.base_url, api=self.api, items=items,
            concurrency=min(concurrency, len(items)),
            sampling=Sampling(max_new_tokens=s.output_len, temperature=s.temperature, seed=s.seed,
                              ignore_eos=s.ignore_eos),
            timeout_s=s.request_timeout_s, stream=s.stream, model=self.model, request_rate=s.request_rate,
            seed=s.seed, hang_limit=s.hung_after_timeouts, on_record=note,
            chat_template_kwargs=s.chat_template_kwargs if self.api == "chat" else None,
        )

    async def accept_length(self) -> float | None:
        """The server's ``avg_spec_accept_length`` now (None without ``/server_info``)."""
        if self.info is None:
            return None
        return srv.accept_length_from_info(await srv.get_server_info(self.session, self.base_url))

    async def flush(self) -> tuple[bool, float | None]:
        """Flush the idle server where flushing works, noting what it did to the accept-length
        counters; returns (flushed, the accept length read after it). The first failure is logged
        once and ends flushing for this run."""
        if not self.flush_supported:
            return False, await self.accept_length()
        met = await self.accept_length()
        reason = await srv.flush_cache(self.session, self.base_url, timeout_s=_health_timeout_s(self.settings))
        if reason is not None:
            logger.warning("/flush_cache failed, not calling it again in this run: %s", reason)
            self.flush_supported = False
            return False, await self.accept_length()
        after = await self.accept_length()
        self.counters.saw_flush(value_before=met, value_after=after)
        return True, after

    def _level(self, concurrency: int, repetitions: list[RepetitionMetrics], warmup: LevelWarmup | None) -> LevelResult:
        s = self.settings
        return summarise_level(
            concurrency=concurrency, request_rate=s.request_rate, repetitions=repetitions,
            noise_metrics=s.noise_metrics, noisy_cv_threshold=s.noisy_cv_threshold, target_metric=s.target_metric,
            target_ci_rel=s.target_ci_rel, warmup=warmup,
        )

    def finish_level(self, concurrency: int) -> LevelResult:
        """Summarise the running level into :attr:`measured` ``.levels`` and start afresh."""
        m = self.measured
        warmup = m.running_warmup.info() if m.running_warmup is not None else None
        level = self._level(concurrency, m.running, warmup)
        m.levels.append(level)
        if warmup is not None:
            m.warmups.append(warmup)
        m.running, m.running_warmup = [], None
        return level

    def aborted(
        self, reason: str, *, phase: Phase, concurrency: int, repetition: int | None = None,
        metrics: RepetitionMetrics | None = None,
    ) -> BenchmarkAborted:
        """The error that ends the run here, carrying what was measured up to now."""
        failure = BenchFailure(
            phase=phase, concurrency=concurrency, repetition=repetition, reason=reason, repetition_metrics=metrics
        )
        return BenchmarkAborted(self.result(failure))

    def result(self, failure: BenchFailure | None = None) -> BenchResult:
        """The result: every finished level, and for a failed run also the running level's finished repetitions."""
        m = self.measured
        levels = list(m.levels)
        if failure is not None and failure.concurrency is not None and m.running:
            warmup = m.running_warmup.info() if m.running_warmup is not None else None
            levels.append(self._level(failure.concurrency, m.running, warmup))
        targets = [level.target_met for level in levels]
        prompts = self.prompts
        return BenchResult(
            status="ok" if failure is None else "failed",
            failure=failure,
            created_at=utc_timestamp(),
            base_url=self.base_url,
            api=self.api,
            model=self.model,
            server=srv.summarise_server_info(self.info),
            flush_cache_supported=self.flush_supported,
            server_accept_length_scope="lifetime" if "lifetime" in m.scopes else ("repetition" if m.scopes else None),
            settings=self.settings,
            dataset=DatasetInfo(
                name=self.settings.dataset,
                path=self.settings.dataset_path,
                num_prompts=len(prompts),
                distinct_prompts=len({p.id for p in prompts}),
                mean_prompt_chars=sum(len(p.text) for p in prompts) / len(prompts),
            ),
            warmup=m.warmup_total(),
            levels=levels,
            num_requests=sum(rep.num_requests for level in levels for rep in level.repetitions),
            num_errors=sum(level.num_errors for level in levels),
            accept_length_mismatch=any(level.accept_length_mismatch for level in levels),
            accept_length_not_checkable=any(level.accept_length_not_checkable for level in levels),
            noisy=any(level.noisy for level in levels),
            drift=any(level.drifts for level in levels),
            target_met=None if not levels or None in targets else all(targets),
        )


# --- the steps --------------------------------------------------------------------------------


async def run_level(
    run: BenchRun, *, concurrency: int, on_repetition: RepetitionCallback | None = None
) -> LevelResult:
    """Measure one concurrency level: :func:`warm_up_level`, then :func:`run_repetition` until
    ``noise.repetition_verdict`` says stop.

    ``on_repetition`` is called once per measured repetition, before the verdict; what it raises
    ends the run. Returns the level's result (also kept in ``run``).

    Raises:
        BenchmarkAborted: as :func:`warm_up_level` and :func:`run_repetition`.
    """
    s = run.settings
    run.measured.begin_level()
    await warm_up_level(run, concurrency=concurrency)
    fewest, most = s.repetition_bounds()
    read = METRICS[s.target_metric].read
    values: list[float | None] = []
    tally = run.measured.running_warmup
    count = repetition_size(s, rate_rps=tally.last_rate_rps if tally is not None else None)
    for repetition in range(most):
        metrics = await run_repetition(run, concurrency=concurrency, repetition=repetition, count=count)
        if metrics.duration_s > 0 and metrics.num_ok:
            count = max(count, repetition_size(s, rate_rps=metrics.num_ok / metrics.duration_s))
        run.measured.running.append(metrics)
        if on_repetition is not None:
            on_repetition(metrics)
        values.append(read(metrics))
        if repetition_verdict(values, min_repetitions=fewest, max_repetitions=most, target_ci_rel=s.target_ci_rel).stop:
            break
    level = run.finish_level(concurrency)
    _log_level(level)
    return level


MAX_REPETITION_REQUESTS = 100_000
"""The most requests one repetition grows to (``min_repetition_s`` at a very high request rate)."""


def repetition_size(settings: BenchSettings, *, rate_rps: float | None) -> int:
    """Requests per repetition: ``num_prompts``, grown so that at ``rate_rps`` (measured at this
    level) one repetition lasts at least ``min_repetition_s``."""
    count = settings.num_prompts
    if settings.min_repetition_s > 0 and rate_rps and rate_rps > 0:
        count = max(count, math.ceil(settings.min_repetition_s * rate_rps))
    return min(count, MAX_REPETITION_REQUESTS)


async def warm_up_level(run: BenchRun, *, concurrency: int) -> LevelWarmup:
    """Warm one level up at its own concurrency: ``warmup_requests`` requests, then (unless
    ``warmup.tolerance`` is null) windows after ``/flush_cache`` until two in a row agree on
    output tok/s (``noise.windows_stable``) or ``warmup.max_windows`` ran. Returns the record.

    Raises:
        BenchmarkAborted: a batch looked hung, or every request of one failed.
    """
    s = run.settings
    tally = run.measured.new_warmup()
    if not s.warmup_requests:
        return tally.finish()
    await _warmup_batch(run, tally, concurrency=concurrency, count=s.warmup_requests, batch=0)
    if s.warmup.tolerance is not None:
        tally.window_requests = s.warmup.window_size(concurrency)
        tally.converged = False
        for window in range(1, s.warmup.max_windows + 1):
            await run.flush()
            result = await _warmup_batch(run, tally, concurrency=concurrency, count=tally.window_requests, batch=window)
            tally.window_tok_per_s.append(output_tok_per_s(result.records, result.duration_s))
            if windows_stable(tally.window_tok_per_s, tolerance=s.warmup.tolerance):
                tally.converged = True
                break
    info = tally.finish()
    _log_warmup(concurrency, info)
    return info


async def _warmup_batch(run: BenchRun, tally: _WarmupTally, *, concurrency: int, count: int, batch: int) -> LoadResult:
    """Send ``count`` warm-up requests and tally them; a hung engine or a batch that failed whole ends the run."""
    result = await run.load(_items(run.prompts, count), concurrency=concurrency, phase="warmup", batch=batch)
    tally.add(result)
    done = sum(1 for r in result.records if r.error is None)
    if result.duration_s > 0 and done:
        tally.last_rate_rps = done / result.duration_s
    failed = [r for r in result.records if r.error is not None]
    kinds = error_counts(result.records)
    if result.hung is not None:
        raise run.aborted(
            f"warm-up stopped: {result.hung} (concurrency {concurrency}, {kinds}); is the engine stuck? "
            "its log should say where",
            phase="warmup", concurrency=concurrency,
        )
    if len(failed) == len(result.records):
        raise run.aborted(
            f"every warm-up request to {run.base_url} at concurrency {concurrency} failed ({kinds}); "
            f"first: {failed[0].error_kind}: {failed[0].error}",
            phase="warmup", concurrency=concurrency,
        )
    return result


async def run_repetition(run: BenchRun, *, concurrency: int, repetition: int,
                         count: int | None = None) -> RepetitionMetrics:
    """One measured repetition: ``/flush_cache``, ``count`` requests (default: every prompt once)
    at ``concurrency``, ``/server_info``. Returns its metrics (:func:`run_level` keeps them).

    Raises:
        BenchmarkAborted: the engine looked hung, or lost requests to connection errors and then
            failed its health check.
    """
    s = run.settings
    flushed, before = await run.flush()
    cpu_before = read_cpu_times()
    result = await run.load(_items(run.prompts, count or len(run.prompts)), concurrency=concurrency, phase="measure",
                            batch=repetition)
    steal = steal_fraction(cpu_before, read_cpu_times())
    after = await run.accept_length()
    counters = run.counters
    if flushed and before is None and after is not None and not counters.decided and run.flush_supported:
        # this repetition's flush met no value: flush the idle server once more to learn what a flush does
        await run.flush()
    reset = flushed and before is None and counters.resets
    if after is not None:
        _note_scope(run.measured.scopes, "repetition" if reset else "lifetime")
    metrics = compute_repetition_metrics(
        records=result.records,
        duration_s=result.duration_s,
        concurrency=concurrency,
        repetition=repetition,
        request_rate=s.request_rate,
        accept_length_server=after,
        accept_length_server_before=before,
        server_counters_reset=reset,
        server_update_interval=srv.decode_log_interval_from_info(run.info),
        accept_length_tolerance=s.accept_length_tolerance,
        host_cpu_steal=steal,
    )

    def stop(reason: str) -> BenchmarkAborted:
        return run.aborted(reason, phase="measure", concurrency=concurrency, repetition=repetition, metrics=metrics)

    if result.hung is not None:
        raise stop(
            f"stopped during concurrency {concurrency}, repetition {repetition}: {result.hung} "
            f"({metrics.num_ok} of {metrics.num_requests} requests completed: {metrics.errors_by_kind}); "
            "is the engine stuck? its log should say where"
        )
    if metrics.num_errors and ({"connection", "not_sent"} & set(metrics.errors_by_kind) or metrics.num_ok == 0):
        reason = await srv.check_health(run.session, run.base_url, timeout_s=_health_timeout_s(s))
        if reason is not None:
            raise stop(
                f"the server stopped serving during concurrency {concurrency}, repetition {repetition} "
                f"({metrics.num_errors} of {metrics.num_requests} requests failed: {metrics.errors_by_kind}): {reason}"
            )
    _log_repetition(metrics)
    return metrics


def _note_scope(scopes: set[str], scope: str) -> None:
    """Record what the server's accept length covered; say once that it is a lifetime mean."""
    if scope == "lifetime" and "lifetime" not in scopes:
        logger.info(
            "the server's avg_spec_accept_length is a lifetime mean (not shown to be reset by /flush_cache); "
            "accept_length comes from the per-request meta_info, the server's value is a cross-check"
        )
    scopes.add(scope)


STEAL_WORTH_SAYING = 0.05
"""CPU steal at which a repetition's log line warns (the quiet VM measured 0-3%)."""


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
    if metrics.host_cpu_steal is not None and metrics.host_cpu_steal >= STEAL_WORTH_SAYING:
        logger.warning(
            "concurrency %d rep %d: the hypervisor gave %.0f%% of this host's CPU to other guests during it (steal); "
            "a CPU-bound engine here measured the neighbours, not its configuration",
            metrics.concurrency, metrics.repetition, 100 * metrics.host_cpu_steal,
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


def _log_warmup(concurrency: int, warmup: LevelWarmup) -> None:
    windows = ", ".join("-" if v is None else f"{v:.1f}" for v in warmup.window_tok_per_s)
    if warmup.num_errors:
        logger.warning(
            "concurrency %d: %d of %d warm-up requests failed: %s",
            concurrency, warmup.num_errors, warmup.num_requests, warmup.errors_by_kind,
        )
    if warmup.converged is False:
        logger.warning(
            "concurrency %d: warm-up did not settle in %d windows of %d requests (tok/s %s); measuring anyway",
            concurrency, len(warmup.window_tok_per_s), warmup.window_requests, windows,
        )
        return
    logger.info(
        "concurrency %d: warm-up %d requests in %.1f s%s", concurrency, warmup.num_requests, warmup.duration_s,
        f", stable after {len(warmup.window_tok_per_s)} windows (tok/s {windows})" if warmup.converged else "",
    )


def _log_level(level: LevelResult) -> None:
    width = "-" if level.ci_rel is None else f"+/-{level.ci_rel:.1%}"
    target = "" if level.target_ci_rel is None else f" (target {level.target_ci_rel:.1%})"
    log = logger.warning if level.target_met is False else logger.info
    log(
        "concurrency %d: %d repetitions, %s 95%% interval %s of the geometric mean%s%s", level.concurrency,
        level.repetitions_used, level.target_metric, width, target,
        ": not met" if level.target_met is False else "",
    )
    if level.noisy:
        logger.warning("concurrency %d is noisy: %s", level.concurrency, ", ".join(level.noisy_metrics))
    if level.drifts and level.drift is not None:
        logger.warning(
            "concurrency %d drifts %s: %s over its %d repetitions has Kendall tau %.2f (Mann-Kendall p=%.3g); "
            "its median describes none of them",
            level.concurrency, level.drift.direction, level.drift.metric, level.drift.num_values, level.drift.tau,
            level.drift.p_value,
        )
