"""Supervisors: restart types, restart strategies and restart intensity, after Erlang/OTP.

A `Supervisor` runs its children in a nursery it owns. A child is described
by a `ChildSpec`: an id, a start function shaped like a Trio service
(`async def start(*, task_status)`, calling `task_status.started(value)`
once usable) and a restart type:

- `permanent`: always restarted, whether it crashed or returned;
- `transient`: restarted only when it crashed (raised);
- `temporary`: never restarted.

When a child has to be restarted, the strategy says who else goes with it:
`one_for_one` restarts only that child, `one_for_all` terminates every other
child (in reverse start order) and restarts them all (in start order),
`rest_for_one` does the same for the children started after it. A sibling
terminated this way that is `temporary` is removed, not restarted.

At most `max_restarts` restarts may happen within `period` seconds (read
with `trio.current_time()`); one more makes the supervisor terminate every
child and fail to its owner with `RestartIntensityError`.

A *hosted* child (`HostedChildSpec`) has no task of its own: its start
function returns its value, it runs tasks only when it has work (in the
supervisor's nursery, through its `ChildHost`), and a task of it that
raises is its crash; terminating it awaits its `stop` function. A runtime
holding many idle agents uses it so that an idle agent costs no task.

A child is a failure boundary: anything it raises is a crash of that child
(`BaseException`s such as `SystemExit` included), recorded as its exit
reason and handled by the strategy; it never reaches the supervisor's other
children. Only `trio.Cancelled` and `KeyboardInterrupt` (or a group holding
one) propagate, as `actors.containment` says.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar, cast, get_args

import attrs
import trio

from actors.containment import must_propagate

RestartType: TypeAlias = Literal["permanent", "transient", "temporary"]
Strategy: TypeAlias = Literal["one_for_one", "one_for_all", "rest_for_one"]
ChildState: TypeAlias = Literal["starting", "running", "restarting", "stopped"]
ExitReason: TypeAlias = Literal["normal", "crashed", "terminated"]

SHUTDOWN_GRACE_SECONDS = 30.0
"""How long a stopping supervisor waits for its children to finish their cleanup."""
EXIT_QUEUE_SIZE = 64
"""Capacity of the channel children report their exits on; a full channel blocks the
exiting child's runner (each incarnation reports at most once)."""

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

_logger = logging.getLogger(__name__)


class SupervisionError(Exception):
    """Any failure of the supervision layer; the message names the supervisor or child."""


class RestartIntensityError(SupervisionError):
    """A supervisor gave up: restarting one more child would exceed its restart intensity.

    `__cause__` is the exception of the exit that triggered the restart (None
    when the child returned normally).
    """


class ChildStartError(SupervisionError):
    """A child's start function failed before it reported started; `__cause__` says why."""


class DuplicateChildError(SupervisionError):
    """A supervisor already has a child with the given id."""


class UnknownChildError(SupervisionError):
    """A supervisor has no child with the given id."""


class ChildStoppedError(SupervisionError):
    """A child's value was asked for, or waited on, while it does not run."""


class NotRunningError(SupervisionError):
    """A service (supervisor, registry, runtime) was used while it does not run."""


class ChildStart(Protocol[T_co]):
    """A child's start function: `async def start(*, task_status) -> None`.

    It calls `task_status.started(value)` once the child is usable and then
    runs until the child is done: returning is a normal exit, raising is a
    crash. Cancellation terminates it; it must honour cancellation promptly
    (shielded cleanup bounded by a deadline).
    """

    def __call__(self, *, task_status: trio.TaskStatus[T_co]) -> Awaitable[None]: ...


class HostedStart(Protocol[T_co]):
    """A hosted child's start function: `async def start(host) -> value`.

    It returns the child's value once the child is usable; the child then
    runs tasks only through `host.start_soon`. Raising is a failed start.
    """

    def __call__(self, host: ChildHost, /) -> Awaitable[T_co]: ...


def _restart_type(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in get_args(RestartType):
        raise ValueError(f"restart must be one of {get_args(RestartType)}, got {value!r}")


@attrs.frozen(kw_only=True)
class ChildSpec(Generic[T]):
    """How to start a child and whether to restart it (see the module docstring)."""

    id: str
    start: ChildStart[T]
    restart: RestartType = attrs.field(default="permanent", validator=_restart_type)


@attrs.frozen(kw_only=True)
class HostedChildSpec(Generic[T]):
    """A child with no task of its own (see the module docstring).

    `start(host)` returns the value; `stop(value)` ends the child (shielded
    by the supervisor, for at most `SHUTDOWN_GRACE_SECONDS`): it must end
    the tasks it started through the host, which are cancelled after it
    returns otherwise. After a crash `stop` runs before the restart.
    """

    id: str
    start: HostedStart[T]
    stop: Callable[[T], Awaitable[None]]
    restart: RestartType = attrs.field(default="permanent", validator=_restart_type)


@attrs.frozen(kw_only=True)
class ChildExit:
    """How a stopped child's last incarnation ended.

    `reason` is "normal" (it returned), "crashed" (it raised; `error` is the
    exception) or "terminated" (its supervisor stopped it; `error` is set if
    it raised while stopping).
    """

    reason: ExitReason
    error: BaseException | None = None


@attrs.frozen(kw_only=True)
class ChildStatistics:
    """A snapshot of one child."""

    id: str
    state: ChildState
    incarnation: int
    restarts: int


@attrs.frozen(kw_only=True)
class SupervisorStatistics:
    """A snapshot of a supervisor's children and restart accounting."""

    name: str
    strategy: Strategy
    running: bool
    children: int
    restarts: int
    restarts_in_window: int
    crashes: int
    max_restarts: int
    period: float


@attrs.define(eq=False)
class _Incarnation:
    """One run of a child's start function.

    A hosted child's incarnation lives as long as the (mostly idle) child,
    so it holds no cancel scope (it has no task of its own) and no event
    until something waits for its end.
    """

    cancel_scope: trio.CancelScope | None = None
    """The task of a child with one (None for a hosted child)."""
    started: bool = False
    terminating: bool = False
    value: object = None
    error: BaseException | None = None
    host: ChildHost | None = None
    """A hosted child's host (None for a child with a task of its own)."""
    _done: bool = False
    _done_event: trio.Event | None = None  # only while someone waits for the end

    @property
    def done(self) -> bool:
        """True once the incarnation has ended (its task returned, or the hosted child stopped)."""
        return self._done

    def set_done(self) -> None:
        """Mark the incarnation ended and wake whoever waits for it; idempotent."""
        self._done = True
        if self._done_event is not None:
            self._done_event.set()

    async def wait_done(self) -> None:
        """Return once the incarnation has ended. Cancellable."""
        if self._done:
            await trio.lowlevel.checkpoint()
            return
        if self._done_event is None:
            self._done_event = trio.Event()
        await self._done_event.wait()

    def cancel(self) -> None:
        """Cancel the incarnation's task, or a hosted child's tasks."""
        if self.cancel_scope is not None:
            self.cancel_scope.cancel()
        if self.host is not None:
            self.host.cancel()


@attrs.define(eq=False)
class ChildHost:
    """Runs a hosted child's tasks in its supervisor's nursery; one per incarnation.

    A task started here that raises is the incarnation's crash: the
    supervisor stops the child (`HostedChildSpec.stop`) and handles the
    exit as for any child. Tasks still running when `stop` returned are
    cancelled.
    """

    _supervisor: Supervisor
    _child: Child[Any]
    _incarnation: _Incarnation
    _scopes: set[trio.CancelScope] | None = None  # only while tasks run
    _idle: trio.Event | None = None  # while someone waits for the tasks to end

    def start_soon(self, async_fn: Callable[[], Awaitable[object]], /) -> None:
        """Start `async_fn()` as one of the child's tasks.

        Raises:
            NotRunningError: the supervisor does not run, or the
                incarnation has ended.
        """
        nursery = self._supervisor._check_running()
        if self._incarnation.done or self._incarnation.terminating:
            raise NotRunningError(
                f"child {self._child.id!r} of supervisor {self._supervisor.name!r} has stopped"
            )
        scope = trio.CancelScope()
        if self._scopes is None:
            self._scopes = set()
        self._scopes.add(scope)
        nursery.start_soon(self._run, async_fn, scope)

    async def _run(
        self, async_fn: Callable[[], Awaitable[object]], scope: trio.CancelScope
    ) -> None:
        error: BaseException | None = None
        try:
            with scope:
                await async_fn()
        except BaseException as exc:  # a hosted child's task is the child: a failure boundary
            if must_propagate(exc):
                raise
            error = exc
        finally:
            self._forget(scope)
        if error is not None:
            await self._supervisor._hosted_crash(self._child, self._incarnation, error)

    def _forget(self, scope: trio.CancelScope) -> None:
        if self._scopes is not None:
            self._scopes.discard(scope)
            if not self._scopes:
                self._scopes = None
                if self._idle is not None:
                    self._idle.set()

    def cancel(self) -> None:
        """Cancel every task of the child that still runs."""
        for scope in list(self._scopes or ()):
            scope.cancel()

    async def cancel_and_wait(self) -> None:
        """Cancel the child's remaining tasks and wait until they ended."""
        while self._scopes:
            self._idle = trio.Event()
            self.cancel()
            await self._idle.wait()
        self._idle = None


@attrs.define(eq=False)
class _StatusRelay(Generic[T]):
    """Passes `started(value)` on to Trio, noting the value on the incarnation."""

    inner: trio.TaskStatus[Any]
    incarnation: _Incarnation

    def started(self, value: T | None = None) -> None:
        self.incarnation.value = value
        self.incarnation.started = True
        # From now on only the supervisor cancels the child, one at a time.
        assert self.incarnation.cancel_scope is not None  # a child with a task of its own
        self.incarnation.cancel_scope.shield = True
        self.inner.started(value)


@attrs.define(eq=False)
class Child(Generic[T]):
    """A supervised child: the handle stays the same across restarts.

    `value` is what the current incarnation passed to `task_status.started`;
    after a restart it is the new incarnation's value.
    """

    spec: ChildSpec[T] | HostedChildSpec[T]
    supervisor: str
    _state: ChildState = attrs.field(default="starting", init=False)
    _incarnation: _Incarnation | None = attrs.field(default=None, init=False)
    _incarnations: int = attrs.field(default=0, init=False)
    _restarts: int = attrs.field(default=0, init=False)
    _exit: ChildExit | None = attrs.field(default=None, init=False)
    # Only while someone waits for a change: an idle child of many keeps no Event.
    _changed: trio.Event | None = attrs.field(default=None, init=False)

    @property
    def id(self) -> str:
        """The child's id, unique within its supervisor."""
        return self.spec.id

    @property
    def state(self) -> ChildState:
        """ "starting", "running", "restarting" or "stopped" (final)."""
        return self._state

    @property
    def incarnation(self) -> int:
        """The number of the current (or last) incarnation: 0 for the first start."""
        return self._incarnations - 1

    @property
    def restarts(self) -> int:
        """How many times this child was restarted."""
        return self._restarts

    @property
    def exit(self) -> ChildExit | None:
        """How the child ended, once it is stopped; None before."""
        return self._exit

    @property
    def value(self) -> T:
        """The current incarnation's started value.

        Raises:
            ChildStoppedError: the child is not running (starting, between
                incarnations, or stopped).
        """
        incarnation = self._incarnation
        if self._state != "running" or incarnation is None:
            raise ChildStoppedError(
                f"child {self.id!r} of supervisor {self.supervisor!r} is {self._state}"
            )
        return cast("T", incarnation.value)

    async def wait_running(self, *, incarnation: int = 0) -> T:
        """Return the value of incarnation `incarnation` (or a later one) once it runs.

        Cancellation: cancellable; cancelling it affects nothing else.

        Raises:
            ChildStoppedError: the child stopped for good first.
        """
        await trio.lowlevel.checkpoint()
        while not (self._state == "running" and self.incarnation >= incarnation):
            if self._state == "stopped":
                raise ChildStoppedError(
                    f"child {self.id!r} of supervisor {self.supervisor!r} stopped "
                    f"before incarnation {incarnation} ran: {self._exit}"
                )
            await self._change()
        return self.value

    async def wait_stopped(self) -> ChildExit:
        """Return how the child ended, once it is stopped for good (never restarted again).

        Cancellation: cancellable; cancelling it affects nothing else.
        """
        await trio.lowlevel.checkpoint()
        while self._exit is None:
            await self._change()
        return self._exit

    def statistics(self) -> ChildStatistics:
        """The child's state, incarnation number and restart count."""
        return ChildStatistics(
            id=self.id, state=self._state, incarnation=self.incarnation, restarts=self._restarts
        )

    def _set_state(self, state: ChildState) -> None:
        self._state = state
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _change(self) -> None:
        if self._changed is None:
            self._changed = trio.Event()
        await self._changed.wait()

    def _stop(self, exit: ChildExit) -> None:
        self._exit = exit
        self._set_state("stopped")


@attrs.frozen(kw_only=True)
class _Exit:
    child: Child[Any]
    incarnation: _Incarnation


def _non_negative(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 0:
        raise ValueError(f"supervisor {attribute.name} must be >= 0, got {value}")


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"supervisor {attribute.name} must be > 0, got {value}")


def _strategy(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in get_args(Strategy):
        raise ValueError(f"strategy must be one of {get_args(Strategy)}, got {value!r}")


def _specs(value: Sequence[ChildSpec[Any]]) -> tuple[ChildSpec[Any], ...]:
    return tuple(value)


@attrs.define(eq=False)
class Supervisor:
    """Starts, watches and restarts children (see the module docstring).

    Run it with `await nursery.start(supervisor.serve)`; `specs` are started
    in order before it reports started, more can be added with
    `start_child`. Children run in the supervisor's own nursery, so none
    outlives it. Once started, a child is cancelled only by its supervisor
    (its cancel scope is shielded from outside cancellation): a stopping
    supervisor terminates its children one at a time, in reverse start
    order, so a later child never outlives one it depends on.

    A supervisor can itself be a child of another supervisor
    (`ChildSpec(id=..., start=supervisor.serve)`): when it is restarted it
    starts over from `specs`.

    A child's start function must not call `start_child` or
    `terminate_child` on its own supervisor: the supervisor is busy
    starting it.
    """

    name: str
    strategy: Strategy = attrs.field(default="one_for_one", validator=_strategy)
    max_restarts: int = attrs.field(default=3, validator=_non_negative)
    period: float = attrs.field(default=5.0, validator=_positive)
    specs: Sequence[ChildSpec[Any]] = attrs.field(default=(), converter=_specs)
    # By id, in start order: a runtime may hold many thousands of children.
    _children: dict[str, Child[Any]] = attrs.field(factory=dict, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _exits: trio.MemorySendChannel[_Exit] = attrs.field(init=False)
    _exit_queue: trio.MemoryReceiveChannel[_Exit] = attrs.field(init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _restart_times: list[float] = attrs.field(factory=list, init=False)
    _restarts: int = attrs.field(default=0, init=False)
    _crashes: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        # One queue for the supervisor's life: a report left over from an
        # earlier run names a stopped child and is ignored.
        self._exits, self._exit_queue = trio.open_memory_channel[_Exit](EXIT_QUEUE_SIZE)

    @property
    def running(self) -> bool:
        """True while `serve` runs and accepts children."""
        return self._nursery is not None

    def children(self) -> list[Child[Any]]:
        """The children that are not stopped, in start order."""
        return list(self._children.values())

    def child(self, child_id: str) -> Child[Any]:
        """The child `child_id`.

        Raises:
            UnknownChildError: there is no such (unstopped) child.
        """
        child = self._children.get(child_id)
        if child is not None:
            return child
        raise UnknownChildError(
            f"supervisor {self.name!r} has no child {child_id!r}; children: {list(self._children)}"
        )

    def statistics(self) -> SupervisorStatistics:
        """Children, restarts (in total and within the current period) and crashes."""
        return SupervisorStatistics(
            name=self.name,
            strategy=self.strategy,
            running=self.running,
            children=len(self._children),
            restarts=self._restarts,
            restarts_in_window=len(self._window(trio.current_time())),
            crashes=self._crashes,
            max_restarts=self.max_restarts,
            period=self.period,
        )

    async def serve(
        self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Start `specs`, report started (with the supervisor), then supervise until cancelled.

        Cancellation terminates every child in reverse start order (shielded,
        for at most `SHUTDOWN_GRACE_SECONDS`) and then returns by raising
        `Cancelled` as usual.

        Raises:
            ChildStartError: a child of `specs` failed to start (before
                `started`; children started so far are terminated).
            RestartIntensityError: a restart would exceed the restart
                intensity; every child has been terminated first.
            SupervisionError: the supervisor is already running.
        """
        if self._nursery is not None:
            raise SupervisionError(f"supervisor {self.name!r} is already running")
        self._children = {}
        self._restart_times = []
        failure: SupervisionError | None = None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                failure = await self._start_specs()
                if failure is None:
                    task_status.started(self)
                    failure = await self._supervise()
            finally:
                self._nursery = None
                with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                    await self._terminate_all()
                for child in self._children.values():  # left after the grace period ran out
                    if child._incarnation is not None:
                        child._incarnation.cancel()
                nursery.cancel_scope.cancel()
        raise failure

    async def start_child(self, spec: ChildSpec[T] | HostedChildSpec[T]) -> Child[T]:
        """Start a child under this supervisor; returns once it reported started.

        The child's start function runs in the caller's task until it calls
        `started` (a hosted child's: until it returns), so cancelling the
        caller before then cancels the start. Under `one_for_one`
        (independent children) starts run side by side; the other strategies
        start one child at a time.

        Raises:
            NotRunningError: the supervisor does not run.
            DuplicateChildError: a child with `spec.id` exists.
            ChildStartError: the start function raised before `started`
                (the child is not kept).
        """
        if self.strategy != "one_for_one":
            async with self._lock:
                return await self._add_and_start(spec)
        # One for one: children are independent, so one child's (slow) start never holds
        # up another's, nor a restart or a termination of another child.
        async with self._lock:
            child = self._add(spec)
        return await self._start_added(child)

    def _add(self, spec: ChildSpec[T] | HostedChildSpec[T]) -> Child[T]:
        self._check_running()
        if spec.id in self._children:
            raise DuplicateChildError(f"supervisor {self.name!r} already has a child {spec.id!r}")
        child: Child[T] = Child(spec=spec, supervisor=self.name)
        self._children[child.id] = child
        return child

    async def _add_and_start(self, spec: ChildSpec[T] | HostedChildSpec[T]) -> Child[T]:
        return await self._start_added(self._add(spec))

    async def _start_added(self, child: Child[T]) -> Child[T]:
        started = False
        try:
            await self._start_incarnation(child)
            started = True
        except BaseException as exc:  # a failed start is the child's failure
            if must_propagate(exc):
                raise
            raise ChildStartError(
                f"child {child.id!r} of supervisor {self.name!r} failed to start: {exc!r}"
            ) from exc
        finally:
            if not started:
                self._abandon(child)
        return child

    async def terminate_child(self, child_id: str) -> ChildExit:
        """Stop the child `child_id` (cancelling it) and remove it; it is not restarted.

        Returns once its incarnation has finished. Under `one_for_one` a
        child is stopped without holding up the starts and terminations of
        the others (a hosted child's `stop` may write for a while); the
        other strategies stop one child at a time. Cancellation: cancellable
        while waiting for the child; the child has been told to stop either way.

        Raises:
            UnknownChildError: there is no such child.
        """
        if self.strategy != "one_for_one":
            async with self._lock:
                child = self.child(child_id)
                exit = await self._terminate(child)
                self._remove(child, exit)
                return exit
        async with self._lock:  # no restart of it is under way once this is held
            child = self.child(child_id)
        # `_terminate` marks the incarnation terminating before its first checkpoint, so
        # the incarnation reports no exit of its own; one reported before (a hosted
        # child's crash being stopped) finds the child removed by the time its handler
        # holds the lock, as the handler yields in taking it.
        exit = await self._terminate(child)
        self._remove(child, exit)
        return exit

    # -- internals ----------------------------------------------------------

    def _check_running(self) -> trio.Nursery:
        if self._nursery is None:
            raise NotRunningError(f"supervisor {self.name!r} is not running")
        return self._nursery

    async def _start_specs(self) -> ChildStartError | None:
        for spec in self.specs:
            try:
                await self.start_child(spec)
            except ChildStartError as exc:
                return exc
        return None

    async def _supervise(self) -> RestartIntensityError:
        while True:
            exit = await self._exit_queue.receive()
            failure = await self._handle_exit(exit)
            if failure is not None:
                return failure

    async def _handle_exit(self, exit: _Exit) -> RestartIntensityError | None:
        async with self._lock:
            child = exit.child
            if child._incarnation is not exit.incarnation or child.state == "stopped":
                return None  # an incarnation already replaced or removed
            error = exit.incarnation.error
            if error is not None:
                self._crashes += 1
            restart = child.spec.restart
            if restart == "temporary" or (restart == "transient" and error is None):
                self._remove(
                    child,
                    ChildExit(reason="normal" if error is None else "crashed", error=error),
                )
                return None
            failure = self._count_restart(child, error)
            if failure is not None:
                return failure
            if self.strategy == "one_for_one":
                targets = [child]
            elif self.strategy == "one_for_all":
                targets = list(self._children.values())
            else:
                children = list(self._children.values())
                targets = children[children.index(child) :]
            child._set_state("restarting")
            for sibling in reversed(targets):
                if sibling is not child:
                    sibling._set_state("restarting")
                    await self._terminate(sibling)
            for target in targets:
                if target is not child and target.spec.restart == "temporary":
                    self._remove(target, ChildExit(reason="terminated"))
                    continue
                failure = await self._restart(target)
                if failure is not None:
                    return failure
            return None

    def _window(self, now: float) -> list[float]:
        return [t for t in self._restart_times if now - t < self.period]

    def _count_restart(
        self, child: Child[Any], error: BaseException | None
    ) -> RestartIntensityError | None:
        now = trio.current_time()
        self._restart_times = self._window(now)
        if len(self._restart_times) >= self.max_restarts:
            how = f"crashed ({error!r})" if error is not None else "returned"
            failure = RestartIntensityError(
                f"supervisor {self.name!r} gave up: child {child.id!r} {how}, and restarting it "
                f"would exceed {self.max_restarts} restarts within {self.period}s"
            )
            failure.__cause__ = error
            return failure
        self._restart_times.append(now)
        self._restarts += 1
        child._restarts += 1
        return None

    async def _restart(self, child: Child[Any]) -> RestartIntensityError | None:
        while True:
            try:
                await self._start_incarnation(child)
                return None
            except BaseException as exc:  # a failed restart is the child's failure
                if must_propagate(exc):
                    raise
                self._crashes += 1
                failure = self._count_restart(child, exc)
                if failure is not None:
                    return failure

    async def _start_incarnation(self, child: Child[Any]) -> None:
        nursery = self._check_running()
        incarnation = _Incarnation()
        child._incarnations += 1
        child._incarnation = incarnation
        spec = child.spec
        if isinstance(spec, HostedChildSpec):
            host = incarnation.host = ChildHost(
                supervisor=self, child=child, incarnation=incarnation
            )
            try:
                incarnation.value = await spec.start(host)
            except BaseException as exc:
                incarnation.error = exc
                with trio.CancelScope(shield=True):
                    await host.cancel_and_wait()
                incarnation.set_done()
                raise
            incarnation.started = True
        else:
            incarnation.cancel_scope = trio.CancelScope()
            await nursery.start(self._run, child, incarnation)
        child._set_state("running")

    async def _stop_hosted(self, child: Child[Any], incarnation: _Incarnation) -> None:
        """Run a hosted child's `stop`, then cancel its leftover tasks; marks it done."""
        spec = child.spec
        assert isinstance(spec, HostedChildSpec) and incarnation.host is not None
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                try:
                    await spec.stop(incarnation.value)
                except BaseException as exc:  # stopping is still the child's code
                    if must_propagate(exc):
                        raise
                    if incarnation.error is None:
                        incarnation.error = exc
                await incarnation.host.cancel_and_wait()
        finally:
            incarnation.host.cancel()
            incarnation.set_done()

    async def _hosted_crash(
        self, child: Child[Any], incarnation: _Incarnation, error: BaseException
    ) -> None:
        """A hosted child's task raised: stop the child, then report its exit."""
        if incarnation.terminating or incarnation.done:
            _logger.warning(
                "child %r of supervisor %r raised while being terminated: %r",
                child.id,
                self.name,
                error,
            )
            return
        incarnation.terminating = True  # its other tasks' errors are not further crashes
        incarnation.error = error
        await self._stop_hosted(child, incarnation)
        await self._exits.send(_Exit(child=child, incarnation=incarnation))

    async def _run(
        self,
        child: Child[Any],
        incarnation: _Incarnation,
        *,
        task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        relay: _StatusRelay[Any] = _StatusRelay(inner=task_status, incarnation=incarnation)
        spec = child.spec
        assert isinstance(spec, ChildSpec)
        assert incarnation.cancel_scope is not None
        try:
            with incarnation.cancel_scope:
                await spec.start(task_status=relay)
        except BaseException as exc:  # a child is a failure boundary: see actors.containment
            if must_propagate(exc):
                raise
            incarnation.error = exc
            if not incarnation.started:
                raise
        finally:
            incarnation.set_done()
        if not incarnation.started:
            return  # Trio reports the missing `started` to the starter
        if incarnation.terminating:
            if incarnation.error is not None:
                _logger.warning(
                    "child %r of supervisor %r raised while being terminated: %r",
                    child.id,
                    self.name,
                    incarnation.error,
                )
            return
        await self._exits.send(_Exit(child=child, incarnation=incarnation))

    async def _terminate(self, child: Child[Any]) -> ChildExit:
        incarnation = child._incarnation
        if incarnation is None:
            return ChildExit(reason="terminated")
        if incarnation.done:
            error = incarnation.error
            return ChildExit(reason="normal" if error is None else "crashed", error=error)
        if incarnation.host is not None and incarnation.terminating:
            await incarnation.wait_done()  # a crash is being stopped already
        elif incarnation.host is not None:
            incarnation.terminating = True
            await self._stop_hosted(child, incarnation)
        else:
            incarnation.terminating = True
            incarnation.cancel()
            await incarnation.wait_done()
        return ChildExit(reason="terminated", error=incarnation.error)

    def _abandon(self, child: Child[Any]) -> None:
        """Drop a child whose `start_child` failed or was cancelled; stop it if it started."""
        incarnation = child._incarnation
        if incarnation is not None and incarnation.started and not incarnation.done:
            incarnation.terminating = True
            incarnation.cancel()
            self._remove(child, ChildExit(reason="terminated"))
            return
        error = incarnation.error if incarnation is not None else None
        self._remove(
            child, ChildExit(reason="terminated" if error is None else "crashed", error=error)
        )

    def _remove(self, child: Child[Any], exit: ChildExit) -> None:
        if self._children.get(child.id) is child:
            del self._children[child.id]
        child._stop(exit)

    async def _terminate_all(self) -> None:
        for child in reversed(list(self._children.values())):
            exit = await self._terminate(child)
            self._remove(child, exit)
