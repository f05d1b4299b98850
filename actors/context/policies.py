"""Sandbox and approval policies: runtime contexts that change mid-session, not the system text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypeAlias

import attrs

from actors.context.errors import ContextPluginError
from actors.prompt import AssembleContext, PromptContext, SystemPrompt
from actors.scope import Registration, Scope

SANDBOX_POLICY_CONTEXT = "sandbox:policy"
SANDBOX_POLICY_ORDER = 110
APPROVAL_POLICY_CONTEXT = "approval:policy"
APPROVAL_POLICY_ORDER = 115

SandboxMode: TypeAlias = Literal["read-only", "workspace-write", "danger-full-access"]
ApprovalMode: TypeAlias = Literal["untrusted", "on-failure", "on-request", "never"]

SANDBOX_TEXTS: Mapping[str, str] = {
    "read-only": (
        "Sandbox policy: read-only. Commands may read files but not change them, and have no "
        "network access."
    ),
    "workspace-write": (
        "Sandbox policy: workspace-write. Commands may read anywhere and change files inside the "
        "workspace only; they have no network access."
    ),
    "danger-full-access": (
        "Sandbox policy: danger-full-access. Commands run without filesystem or network "
        "restrictions."
    ),
}
"""The runtime-context text of each sandbox mode."""

APPROVAL_TEXTS: Mapping[str, str] = {
    "untrusted": (
        "Approval policy: untrusted. Every command except known-safe reads needs the user's "
        "approval before it runs."
    ),
    "on-failure": (
        "Approval policy: on-failure. Commands run in the sandbox; ask the user for approval to "
        "rerun one outside it only after it failed there."
    ),
    "on-request": (
        "Approval policy: on-request. Commands run in the sandbox; ask the user for approval "
        "when an action needs more than the sandbox allows."
    ),
    "never": (
        "Approval policy: never. Never ask the user for approval; work within the sandbox and "
        "report what it prevented."
    ),
}
"""The runtime-context text of each approval mode."""


def _check_mode(kind: str, texts: Mapping[str, str], mode: str) -> None:
    if mode not in texts:
        raise ContextPluginError(f"unknown {kind} mode {mode!r}; known modes: {', '.join(texts)}")


def _check_sandbox(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    _check_mode("sandbox", SANDBOX_TEXTS, value)


def _check_approval(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    _check_mode("approval", APPROVAL_TEXTS, value)


@attrs.define(eq=False)
class Policies:
    """The current sandbox and approval modes, as two runtime contexts.

    The contexts `sandbox:policy` (order 110) and `approval:policy` (order
    115) read the current modes at every assembly, so a change made with
    `set_sandbox` / `set_approval` lands in the runtime-context snapshot of
    the next step that is assembled (the step already assembled keeps what
    it saw), while the system text and its request header stay untouched.

    Raises:
        ContextPluginError: an unknown mode, at construction or when set.
    """

    _sandbox: SandboxMode = attrs.field(
        default="workspace-write", alias="sandbox", validator=_check_sandbox
    )
    _approval: ApprovalMode = attrs.field(
        default="on-request", alias="approval", validator=_check_approval
    )

    @property
    def sandbox(self) -> SandboxMode:
        """The current sandbox mode."""
        return self._sandbox

    @property
    def approval(self) -> ApprovalMode:
        """The current approval mode."""
        return self._approval

    def set_sandbox(self, mode: SandboxMode) -> None:
        """Switch the sandbox mode; raises `ContextPluginError` naming an unknown mode."""
        _check_mode("sandbox", SANDBOX_TEXTS, mode)
        self._sandbox = mode

    def set_approval(self, mode: ApprovalMode) -> None:
        """Switch the approval mode; raises `ContextPluginError` naming an unknown mode."""
        _check_mode("approval", APPROVAL_TEXTS, mode)
        self._approval = mode

    def install(self, system_prompt: SystemPrompt, *, scope: Scope | None = None) -> Registration:
        """Register both policy contexts in `system_prompt` (in `scope`; None: globally).

        Disposing the returned registration removes both; so does closing `scope`.

        Raises:
            PromptError: the layer already has a context of either name.
        """
        sandbox = system_prompt.context(
            PromptContext(
                name=SANDBOX_POLICY_CONTEXT, order=SANDBOX_POLICY_ORDER, text=self._sandbox_text
            ),
            scope=scope,
        )
        try:
            approval = system_prompt.context(
                PromptContext(
                    name=APPROVAL_POLICY_CONTEXT,
                    order=APPROVAL_POLICY_ORDER,
                    text=self._approval_text,
                ),
                scope=scope,
            )
        except Exception:
            sandbox.dispose()
            raise

        def remove() -> None:
            approval.dispose()
            sandbox.dispose()

        return Registration(remove=remove)

    def _sandbox_text(self, ctx: AssembleContext) -> str:
        return SANDBOX_TEXTS[self._sandbox]

    def _approval_text(self, ctx: AssembleContext) -> str:
        return APPROVAL_TEXTS[self._approval]
