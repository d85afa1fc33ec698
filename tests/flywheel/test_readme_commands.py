"""README.md and the documentation site (``docs/**/*.md``) against the command line: every
``flywheel <command> [<subcommand>]`` and every ``--flag`` they name exists, every option and
argument has help text, and each group's help names all its subcommands.

Each page is read as Markdown: fenced code blocks (shell lines split at ``&&``, ``||``,
``;``, pipes and redirections, continuation lines joined) and inline code spans (table
cells included, where ``\\|`` is an alternation: ``flywheel models list\\|push DIR``). In a
span, ``flywheel CMD`` or a span that starts with a command and a flag or subcommand
(``retrain --dry-run``, ``models promote --from-shadow``) names a command, and the flags that
follow it are its options. A flag named anywhere else in a span must be an option of some
command. The CLI side is typer's click tree (``typer.main.get_command``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pytest
import typer

from flywheel.cli import app
from tests.support.paths import ROOT

README = ROOT / "README.md"
#: the README and every page of the documentation site: what a reader copies commands from
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
#: where the Protocols are listed (the architecture page)
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: flags the pages name that belong to other tools, with where they come from
FOREIGN_FLAGS = {"--model_alias": "llama-cpp-python's server"}
ALWAYS = {"--help"}   # click adds it to every command; it is not among the params

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
# a code span may wrap onto the next line, never across a blank one
_SPAN = re.compile(r"(?<!`)`((?:[^`\n]|\n(?![ \t]*\n))+)`(?!`)")
_SHELL_SPLIT = re.compile(r"&&|\|\||;|\s\|\s|\d?>>?(?:&\d)?")
_INVOKE = re.compile(r"(?<![^\s/])flywheel[ \t\n]+(?P<cmd>[a-z][a-z0-9-]*)")
_FLAG = re.compile(r"(?<![\w-])--[a-zA-Z][\w-]*")
_WORD = re.compile(r"[a-z][a-z0-9-]*")


# ----------------------------------------------------------------------------- the CLI
@dataclass
class Cli:
    commands: dict[str, object]                    # "classify", "models push", ...: click command
    groups: dict[str, set[str]] = field(default_factory=dict)
    root_flags: set[str] = field(default_factory=set)     # `flywheel --version`

    @classmethod
    def of(cls, root) -> Cli:
        cli = cls({}, root_flags={o for p in root.params for o in p.opts if o.startswith("-")})
        for name, cmd in root.commands.items():
            cli.commands[name] = cmd
            subs = getattr(cmd, "commands", None)   # typer bundles its own click: no isinstance
            if subs is not None:
                cli.groups[name] = set(subs)
                for sub, subcmd in subs.items():
                    cli.commands[f"{name} {sub}"] = subcmd
        return cli

    def flags(self, command: str) -> set[str]:
        params = getattr(self.commands[command], "params", [])
        return ALWAYS | {o for p in params for o in (*p.opts, *getattr(p, "secondary_opts", ()))
                         if o.startswith("-")}

    def all_flags(self) -> set[str]:
        return set().union(self.root_flags, *(self.flags(c) for c in self.commands))


@pytest.fixture(scope="module")
def cli() -> Cli:
    return Cli.of(typer.main.get_command(app))


# ----------------------------------------------------------------------------- the README
@dataclass(frozen=True)
class Span:
    line: int
    text: str
    fenced: bool


def spans(markdown: str) -> list[Span]:
    """Every fenced shell segment and inline code span, with the line it starts on."""
    out: list[Span] = []

    def line_at(text: str, pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    for block in _FENCE.finditer(markdown):
        first = line_at(markdown, block.start(1))
        lines = block.group(1).split("\n")
        i = 0
        while i < len(lines):
            start, text = i, lines[i]
            while text.rstrip().endswith("\\") and i + 1 < len(lines):   # continuation lines
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i]
            for segment in _SHELL_SPLIT.split(text):
                if segment.strip():
                    out.append(Span(first + start, segment.strip(), True))
            i += 1
    # inline spans outside the fences (blanked, keeping the line count)
    prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)
    for m in _SPAN.finditer(prose):
        out.append(Span(line_at(prose, m.start()), " ".join(m.group(1).replace("\\|", "|").split()), False))
    return out


def check_readme(markdown: str, cli: Cli, name: str = "README.md") -> tuple[list[str], set[str]]:
    """``(problems, commands named)``: each problem names the page (``name``) and line, the
    span and the command or flag that does not exist."""
    problems: list[str] = []
    named: set[str] = set()
    every_flag = cli.all_flags()

    def bad(span: Span, what: str) -> None:
        problems.append(f"{name}:{span.line}: `{span.text}`: {what}")

    def check_flags(span: Span, text: str, command: str | None) -> None:
        for flag in _FLAG.findall(text):
            if command is not None:
                if flag not in cli.flags(command):
                    bad(span, f"`flywheel {command}` has no option {flag} "
                              f"(it has {', '.join(sorted(cli.flags(command) - ALWAYS))})")
            elif flag not in every_flag and flag not in FOREIGN_FLAGS:
                bad(span, f"no flywheel command has an option {flag}")

    for span in spans(markdown):
        text = span.text
        starts = [(m.start(), m.start("cmd"), m.group("cmd")) for m in _INVOKE.finditer(text)]
        if not span.fenced:   # `retrain --dry-run`, `models promote --from-shadow`: a command without its root
            head = text.split(maxsplit=2)
            if (len(head) >= 2 and head[0] in cli.commands and not starts
                    and (head[1].startswith("--") or head[1] in cli.groups.get(head[0], ()))):
                starts = [(0, 0, head[0])]
        if not starts:
            if not span.fenced:   # another tool's command line in a fence is not ours to check
                check_flags(span, text, None)
            continue
        check_flags(span, text[:starts[0][0]], None)
        for i, (_, at, cmd) in enumerate(starts):
            end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
            rest = text[at + len(cmd):end]
            if cmd not in cli.commands:
                bad(span, f"`flywheel {cmd}` is not a command (commands: "
                          f"{', '.join(sorted(c for c in cli.commands if ' ' not in c))})")
                continue
            if cmd not in cli.groups:
                named.add(cmd)
                check_flags(span, rest, cmd)
                continue
            named.add(cmd)
            sub = None
            for piece in rest.split("|"):   # `models list|push DIR|promote V`, `models shadow V|--clear`
                words = piece.split()
                if not words:
                    continue
                if words[0][0] in "-[":
                    if sub is None:
                        bad(span, f"`flywheel {cmd}` takes a subcommand before {words[0]}")
                        continue
                elif _WORD.fullmatch(words[0]) and words[0] in cli.groups[cmd]:
                    sub = f"{cmd} {words[0]}"
                    named.add(sub)
                elif sub is None or _WORD.fullmatch(words[0]):
                    bad(span, f"`flywheel {cmd} {words[0]}` is not a command "
                              f"({cmd} has {', '.join(sorted(cli.groups[cmd]))})")
                    continue
                if sub is not None:
                    check_flags(span, piece, sub)
    return problems, named


# ----------------------------------------------------------------------------- tests
def test_every_command_and_flag_the_pages_name_exists(cli):
    problems: list[str] = []
    named: set[str] = set()
    assert len(PAGES) > 10, PAGES   # the README and the site's pages
    for page in PAGES:
        found, names = check_readme(page.read_text(encoding="utf-8"), cli, str(page.relative_to(ROOT)))
        problems += found
        named |= names
    assert not problems, "the pages name commands or flags the CLI does not have:\n" + "\n".join(problems)
    # the parser really read the command table and the prose (not a vacuous pass)
    assert {"classify", "serve", "train", "eval", "retrain", "stats", "prune-log", "models push",
            "models shadow", "models promote", "models prune"} <= named, sorted(named)


def test_the_readme_check_names_what_is_missing(cli):
    markdown = "\n".join([
        "| `flywheel models list\\|pusj DIR\\|prune` | versions |",
        "Run `flywheel retrian --shadow`, then `retrain --no-such-flag`.",
        "```bash",
        "pip install x && FLYWHEEL_HOME=/srv/flywheel .venv/bin/flywheel stats \\",
        "    --window day --colour >> /var/log/x 2>&1",
        "```",
        "Also `--frobnicate 3` and `flywheel models shadow V\\|--clear` and `--model_alias`.",
    ])
    problems, named = check_readme(markdown, cli)
    text = "\n".join(problems)
    assert "README.md:1:" in text and "`flywheel models pusj` is not a command" in text
    assert "README.md:2:" in text and "`flywheel retrian` is not a command" in text
    assert "`flywheel retrain` has no option --no-such-flag" in text
    assert "README.md:4:" in text and "`flywheel stats` has no option --colour" in text
    assert "no flywheel command has an option --frobnicate" in text
    assert len(problems) == 5, text     # --window, --clear and the foreign --model_alias pass
    assert {"models list", "models prune", "models shadow", "stats", "retrain"} <= named


def test_every_option_and_argument_has_help_text(cli):
    missing = [f"flywheel {name} {'/'.join(p.opts)}" for name, cmd in sorted(cli.commands.items())
               for p in getattr(cmd, "params", []) if not (getattr(p, "help", None) or "").strip()]
    assert not missing, "options or arguments without help text:\n" + "\n".join(missing)


def test_each_group_help_names_all_its_subcommands(cli):
    for group, subs in cli.groups.items():
        short = cli.commands[group].help or ""
        absent = sorted(s for s in subs if not re.search(rf"\b{re.escape(s)}\b", short))
        assert not absent, f"`flywheel --help` describes {group} as {short!r}, without {absent}"


def test_the_architecture_page_names_every_protocol_seam():
    # the seams are classes deriving from typing.Protocol in the library packages
    readme = ARCHITECTURE.read_text(encoding="utf-8")
    found = {}
    for package in ("classifier", "logstore", "fleet", "training", "service"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for name in re.findall(r"^class (\w+)\((?:\w+, )*Protocol\):", path.read_text(encoding="utf-8"), re.M):
                if not name.startswith("_"):      # a private Protocol is no seam
                    found[name] = path.relative_to(ROOT)
    assert {"Embedder", "Teacher", "LogSink", "Registry"} <= set(found), found
    absent = {n: str(p) for n, p in found.items() if f"`{n}`" not in readme}
    assert not absent, f"Protocols docs/architecture.md does not name: {absent}"
