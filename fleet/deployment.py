"""``flywheel check``: what this deployment serves, what it is configured for, and whether
they agree, read through the site (:meth:`~fleet.site.Site.served`,
:meth:`~fleet.site.Site.contract`), the one owner of both answers.

A deploy step runs it first: :attr:`DeploymentCheck.agree` is false when the served
pointer names a version of another intent set than the configured file (a start would
then serve an older stored version of the file, or refuse), when no version of the file
is stored at all, or when the configured file cannot be read; :attr:`DeploymentCheck.fix`
names the command that mends it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flywheel.classifier.errors import FlywheelError
from flywheel.classifier.versions.served import ServedVersion, set_difference
from flywheel.fleet.site import Site

__all__ = ["DeploymentCheck", "check_deployment"]


@dataclass(frozen=True)
class DeploymentCheck:
    """The answer of :func:`check_deployment`: ``served`` (``None`` when nothing can be
    served), ``pointer`` (the version the registry's ``CURRENT`` names; ``None``: nothing
    promoted), ``configured`` (the intents file, ``None`` without an ``intents`` setting),
    ``configured_digest``, ``agree``, the ``problems`` in words and the ``fix``."""

    served: ServedVersion | None
    pointer: str | None
    configured: str | None
    configured_digest: str | None
    agree: bool
    problems: list[str] = field(default_factory=list)
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        s = self.served
        return {"agree": self.agree, "pointer": self.pointer,
                "served": None if s is None else {"version": s.version, "intent_set": s.digest,
                                                  "labels": list(s.labels), "encoder": s.encoder,
                                                  "source": s.source},
                "configured": None if self.configured is None else {"intents": self.configured,
                                                                    "intent_set": self.configured_digest},
                "problems": list(self.problems), "fix": self.fix}

    def lines(self) -> list[str]:
        s = self.served
        out = [f"served:     {s.summary() if s is not None else 'nothing can be served'}"]
        if self.pointer is not None and (s is None or s.version != self.pointer):
            out.append(f"pointer:    CURRENT names {self.pointer}")
        out.append(f"configured: {self.configured} (set {self.configured_digest})" if self.configured
                   else "configured: no intents setting (the served version's set is the deployment's)")
        out.append("agree:      yes" if self.agree else "agree:      NO")
        out += [f"problem:    {p}" for p in self.problems]
        if self.fix:
            out.append(f"fix:        {self.fix}")
        return out


def check_deployment(site: Site) -> DeploymentCheck:
    """Read what ``site`` (a :class:`~fleet.site.Site`) serves and is configured for, and
    whether they agree; never raises for a deployment in a bad state (it says so)."""
    pointer = site.registry().current()[0]
    try:
        contract = site.contract()
    except FlywheelError as exc:
        return DeploymentCheck(None, pointer, str(site.cfg.intents), None, False, [str(exc)],
                               "fix the intents file, or point the intents setting at the right one")
    configured, digest = (contract.source or None), contract.digest
    try:
        served = site.served()
    except FlywheelError as exc:
        return DeploymentCheck(None, pointer, configured, digest, False, [str(exc)],
                               f"flywheel retrain --intents {configured} trains it and promotes it")
    if contract.intents is None:
        return DeploymentCheck(served, pointer, None, None, True)
    problems: list[str] = []
    fix = ""
    diff = None if served.intents is None else set_difference(contract.intents, served.intents, served.version)
    if diff is not None:
        problems.append(f"{served.version} was trained on another intent set ({diff})")
        fix = f"flywheel retrain --intents {configured} trains it and promotes it"
    elif pointer is not None and served.version != pointer:
        problems.append(f"CURRENT names {pointer}, trained on another intent set; a process serves {served.version}, "
                        f"the newest stored version of the file")
        fix = f"flywheel models promote {served.version}"
    return DeploymentCheck(served, pointer, configured, digest, not problems, problems, fix)
