"""A verl job as its users write it: the bash script or command line that starts verl's trainer,
read into the Hydra overrides it hands `verl.trainer.main_ppo`.

verl's example scripts (`examples/grpo_trainer/run_*.sh`, `examples/ppo_trainer/run_*.sh`) use a
small part of bash: assignments (`gen_tp=4`, `export X=...`), expansions (`$VAR`, `${VAR}`,
`${VAR:-default}`), line continuations, single and double quotes, `set -x`, comments, commands
that only prepare the host (`huggingface-cli download ... &`, `wait`), an `if [ "$a" = "b" ]` on
the script's own values, and a trailing `$@` that passes the caller's arguments to the trainer.
The trainer is `python3 -m verl.trainer.main_ppo`, also under `torchrun ... -m` or behind
`ray job submit ... --`. That subset is read here statically, exactly as bash would expand it; a
construct whose value only a run knows (a loop, a `$(...)` whose value reaches the trainer, an
`if` on a runtime value, a function) is refused in one line naming the script line and what to
pass instead. Nothing is guessed.

The trainer's arguments are then read as Hydra reads them (Hydra's own override parser): `key=v`,
`+key=v`, `++key=v`, `~key`, quoted lists and dicts; each comes back as a canonical `--set` line
(`[+|++|~]key=<JSON value>`) that the project's composition judges against verl's schema.

Standard library at import (Hydra loads when the overrides are read).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_recipes import RecipeError

#: verl's trainer module, as `python3 -m` names it
TRAINER = "verl.trainer.main_ppo"
#: `--config-path` values that name verl's own config folder (Hydra reads them relative to main_ppo.py)
VERL_CONFIG_PATHS = ("config", "./config")
_PYTHONS = re.compile(r"^(.*/)?python(3(\.\d+)?)?$")
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_KEYWORDS_REFUSED = {
    "for": "a `for` loop",
    "while": "a `while` loop",
    "until": "an `until` loop",
    "case": "a `case` statement",
    "select": "a `select` loop",
    "function": "a function",
}
#: words before a command that run it unchanged
_PREFIXES = ("nohup", "exec", "time", "env")
#: commands that only set shell options or wait for background work: read, nothing to run
_SHELL_ONLY = {"set", "wait", "true", ":", "shopt", "ulimit", "umask", "cd", "pushd", "popd", "echo", "printf"}


@dataclass(frozen=True)
class Override:
    """One of the trainer's Hydra overrides: the canonical `--set` line and where it came from."""

    text: str  # "[+|++|~]key=<JSON value>" ("~key" for a deletion)
    key: str
    line: int  # the script line it was written on (0: the command line or the caller's arguments)
    raw: str  # the argument as bash handed it to the trainer


@dataclass(frozen=True)
class VerlCommand:
    """The trainer call one script or command line makes."""

    source: str  # the script's path, or "the command line"
    line: int  # the script line the trainer's command starts on (0 for a command line)
    launcher: str  # "python3 -m", "torchrun", "ray job submit"
    config_name: str | None  # --config-name, where given
    overrides: tuple[Override, ...]
    skipped: tuple[str, ...] = field(default_factory=tuple)  # "line N: cmd" the reading left out

    def keys(self) -> dict[str, Override]:
        """The last override of each key (Hydra applies them in order: the last one wins)."""
        return {o.key: o for o in self.overrides}


class _Unknown:
    """A value only a run knows (a command substitution): carried, and refused where it is used."""

    def __init__(self, line: int, text: str) -> None:
        self.line, self.text = line, text


# ---------------------------------------------------------------------------------------------
# bash: logical lines, words, expansion


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) per logical line: continuations joined, comments dropped."""
    out: list[tuple[int, str]] = []
    buf, start, quote = "", 0, ""
    for no, raw in enumerate(text.splitlines(), 1):
        if not buf:
            start = no
        line, quote = _strip_comment(raw, quote)
        if quote:  # a quoted string goes on over the line break
            buf += line + "\n"
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            buf += line[:-1] + f" {_MARK}{no + 1}{_MARK} "  # the words after it are on the next line
            continue
        buf += line
        if buf.strip():
            out.append((start, buf.strip()))
        buf = ""
    if quote:
        raise RecipeError(f"line {start}: a {quote} quote is not closed")
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def _strip_comment(line: str, quote: str) -> tuple[str, str]:
    """The line without its `# comment` (outside quotes), and the quote still open at its end."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c == "\\":
            i += 2
            continue
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t;&|"):
            return line[:i].rstrip(), quote
        i += 1
    return line, quote


_OPERATORS = ("&&", "||", ";;", ";", "&", "|")
#: marks, in a logical line, where the next physical line starts (`\x00<line number>\x00`)
_MARK = "\x00"


def _split_words(line: str, no: int) -> list[tuple[str, int]]:
    """Raw words (quotes kept, to expand later) and control operators of one logical line, each
    with the script line it is on."""
    words: list[tuple[str, int]] = []
    cur, i, n = "", 0, len(line)
    quote = ""
    depth = 0  # inside ${...} or $(...)
    while i < n:
        c = line[i]
        if quote:
            cur += c
            if c == "\\" and quote == '"' and i + 1 < n:
                cur += line[i + 1]
                i += 2
                continue
            if c == quote:
                quote = ""
            i += 1
            continue
        if c == "\\" and i + 1 < n:
            cur += line[i : i + 2]
            i += 2
            continue
        if c in "'\"":
            quote = c
            cur += c
        elif c == "$" and i + 1 < n and line[i + 1] in "{(":
            depth += 1
            cur += line[i : i + 2]
            i += 2
            continue
        elif depth:
            depth += 1 if c in "({" else -1 if c in ")}" else 0
            cur += c
        elif c == _MARK:
            end = line.index(_MARK, i + 1)
            if cur:
                words.append((cur, no))
                cur = ""
            no = int(line[i + 1 : end])
            i = end + 1
            continue
        elif c in " \t\n":
            if cur:
                words.append((cur, no))
                cur = ""
        elif c == ">" or (c == "&" and line.startswith("&>", i)):
            # output redirection (`> log`, `2>&1`, `&> log`): where the output goes, not the job
            if cur.isdigit():
                cur = ""
            i += 2 if line.startswith((">>", ">&", "&>"), i) else 1
            while i < n and line[i] in " \t":
                i += 1
            while i < n and line[i] not in " \t;&|":
                i += 1
            continue
        elif c in ";&|<()" and not depth:
            if c == "<":
                raise RecipeError(
                    f"line {no}: an input redirection or here-document (<) is not read here; write it out"
                )
            if cur:
                words.append((cur, no))
                cur = ""
            op = next(o for o in (*_OPERATORS, "(", ")") if line.startswith(o, i))
            words.append((op, no))
            i += len(op)
            continue
        else:
            cur += c
        i += 1
    if cur:
        words.append((cur, no))
    return words


@dataclass
class _Shell:
    """The state of the script being read: its variables, the caller's arguments, the environment."""

    env: Mapping[str, str]
    args: Sequence[str]
    vars: dict[str, str | _Unknown] = field(default_factory=dict)

    def get(self, name: str, no: int) -> str | _Unknown | None:
        if name.isdigit():  # $1, ${1:-default}: the caller's arguments
            k = int(name)
            if k == 0:
                raise RecipeError(f"line {no}: $0 is known only when the script runs; write its value out")
            return self.args[k - 1] if k <= len(self.args) else None
        if name in self.vars:
            return self.vars[name]
        return self.env.get(name)

    def expand(self, word: str, no: int) -> list[str | _Unknown]:
        """bash's expansion of one raw word: quotes removed, variables substituted, unquoted
        expansions split on blanks, `$@` spliced as the caller's arguments."""
        fields: list[str | _Unknown] = []
        cur = ""
        have = False  # a quoted empty string is still a word
        i, n = 0, len(word)
        quote = ""
        unknown: _Unknown | None = None

        def push() -> None:
            nonlocal cur, have, unknown
            if unknown is not None:
                fields.append(unknown)
            elif cur or have:
                fields.append(cur)
            cur, have, unknown = "", False, None

        while i < n:
            c = word[i]
            if quote == "'":
                if c == "'":
                    quote = ""
                else:
                    cur += c
                i += 1
                continue
            if c == "\\":
                nxt = word[i + 1] if i + 1 < n else ""
                if quote == '"' and nxt not in '$`"\\':
                    cur += c
                else:
                    cur += nxt
                i += 2
                continue
            if c in "'\"" and (not quote or quote == c):
                have = True
                quote = "" if quote else c
                i += 1
                continue
            if c == "`":
                raise RecipeError(f"line {no}: a `...` command substitution is not read here; write its value out")
            if c == "$":
                i, value, splice = self._dollar(word, i, no)
                if splice is not None:  # $@ / $*
                    if quote:
                        if splice:
                            cur += splice[0]
                            if len(splice) > 1:
                                push()
                                fields.extend(splice[1:-1])
                                cur = splice[-1]
                    else:
                        parts = list(splice)
                        if parts:
                            cur += parts[0]
                            for p in parts[1:]:
                                push()
                                cur = p
                    continue
                if isinstance(value, _Unknown):
                    unknown = value
                    continue
                if quote:
                    cur += value
                    have = True
                else:
                    pieces = value.split()
                    if value[:1].isspace() and (cur or have):
                        push()
                    for k, p in enumerate(pieces):
                        if k:
                            push()
                        cur += p
                    if value[-1:].isspace() and pieces:
                        push()
                continue
            cur += c
            i += 1
        if quote:
            raise RecipeError(f"line {no}: a {quote} quote is not closed in {word}")
        push()
        return fields

    def _dollar(self, word: str, i: int, no: int) -> tuple[int, str | _Unknown, list[str] | None]:
        """The expansion at word[i] == "$": (next index, value, spliced words for $@)."""
        n = len(word)
        nxt = word[i + 1] if i + 1 < n else ""
        if nxt in "@*":
            return i + 2, "", list(self.args)
        if nxt == "(":
            end = _matching(word, i + 1, "(", ")", no)
            text = word[i : end + 1]
            if text.startswith("$((") and text.endswith("))"):
                return end + 1, self._arithmetic(text[3:-2], no), None
            return end + 1, _Unknown(no, text), None
        if nxt == "{":
            end = _matching(word, i + 1, "{", "}", no)
            return end + 1, self._braced(word[i + 2 : end], no), None
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9#?$!]", word[i + 1 :])
        if not m:
            return i + 1, "$", None
        name = m.group(0)
        if name in "#?$!":
            raise RecipeError(f"line {no}: ${name} is known only when the script runs; write its value out")
        v = self.get(name, no)
        return i + 1 + len(name), "" if v is None else v, None

    def _braced(self, inner: str, no: int) -> str | _Unknown:
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:(:?[-=+?])(.*))?$", inner, re.S)
        if not m:
            raise RecipeError(f"line {no}: ${{{inner}}} is not read here; write its value out")
        name, op, rest = m.group(1), m.group(2), m.group(3)
        v = self.get(name, no)
        if op is None:
            return "" if v is None else v
        empty = v is None or (op.startswith(":") and v == "")
        if op.endswith("+"):
            return "" if empty else self._word_value(rest, no)
        if op.endswith("?"):
            if empty:
                raise RecipeError(f"line {no}: {name} must be set ({rest or 'the script requires it'}); set it")
            assert v is not None
            return v
        if not empty:
            assert v is not None
            return v
        default = self._word_value(rest, no)
        if op.endswith("=") and not isinstance(default, _Unknown):
            self.vars[name] = default
        return default

    def _arithmetic(self, expr: str, no: int) -> str | _Unknown:
        """`$((1024 * 2))`: integer arithmetic on numbers and the script's variables."""

        def var(m: re.Match[str]) -> str:
            v = self.get(m.group(1) or m.group(2), no)
            if isinstance(v, _Unknown):
                raise RecipeError(f"line {no}: $(({expr})) uses {v.text} (line {v.line}); write its value out")
            return str(v or 0)

        text = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?|\b([A-Za-z_][A-Za-z0-9_]*)\b", var, expr)
        if not re.fullmatch(r"[0-9+\-*/%() \t]*", text) or "**" in text:
            raise RecipeError(
                f"line {no}: $(({expr})) is not read here (integers and + - * / % only); write its value out"
            )
        try:
            value = eval(text.replace("/", "//"), {"__builtins__": {}}, {})  # digits and operators only
        except (SyntaxError, ZeroDivisionError):
            raise RecipeError(f"line {no}: $(({expr})) is not valid arithmetic; write its value out") from None
        return str(int(value))

    def _word_value(self, raw: str, no: int) -> str | _Unknown:
        vals = self.expand(raw, no) if raw else []
        bad = next((v for v in vals if isinstance(v, _Unknown)), None)
        return bad if bad is not None else " ".join(str(v) for v in vals)


def _matching(s: str, start: int, open_: str, close: str, no: int) -> int:
    depth = 0
    for k in range(start, len(s)):
        if s[k] == open_:
            depth += 1
        elif s[k] == close:
            depth -= 1
            if depth == 0:
                return k
    raise RecipeError(f"line {no}: {open_} without its {close}")


# ---------------------------------------------------------------------------------------------
# bash: statements


@dataclass(frozen=True)
class _Cmd:
    no: int
    words: tuple[str, ...]  # raw words
    lines: tuple[int, ...] = ()  # the script line of each word

    def line_of(self, k: int) -> int:
        return self.lines[k] if k < len(self.lines) else self.no


def _statements(text: str) -> list[_Cmd]:
    """The script's simple commands, one per `;`/`&&`/`&`/newline, with their line numbers."""
    out: list[_Cmd] = []
    for no, line in _logical_lines(text):
        cur: list[str] = []
        at: list[int] = []
        piped = False
        for w, wl in _split_words(line, no):
            if piped and not cur and w != "tee":
                raise RecipeError(f"line {no}: a pipe into `{w}` is not read here (only `| tee FILE`); remove it")
            if w in (";", "&&", "&", "||", "|", ";;", "(", ")"):
                if w == "|" and cur:
                    # `trainer ... | tee log`: the log's copy, not the job
                    out.append(_Cmd(at[0], tuple(cur), tuple(at)))
                    cur, at, piped = [], [], True
                    continue
                if w == "||":
                    raise RecipeError(
                        f"line {no}: `{w}` is not read here (its effect depends on a command's result); "
                        "split it into plain commands"
                    )
                if w in ("(", ")", ";;"):
                    raise RecipeError(f"line {no}: `{w}` (a subshell, function or case) is not read here; write it out")
                if cur and not piped:
                    out.append(_Cmd(at[0], tuple(cur), tuple(at)))
                cur, at, piped = [], [], False
                continue
            cur.append(w)
            at.append(wl)
        if cur and not piped:
            out.append(_Cmd(at[0], tuple(cur), tuple(at)))
    return out


def _test_value(shell: _Shell, words: Sequence[str], no: int) -> bool:
    """`[ A = B ]`, `[ A != B ]`, `[ -z A ]`, `[ -n A ]` (and `[[ ]]`) on values the script knows."""
    vals: list[str] = []
    for w in words:
        for v in shell.expand(w, no) or [""]:
            if isinstance(v, _Unknown):
                raise RecipeError(
                    f"line {no}: this `if` tests {v.text} (line {v.line}), known only when the script runs; "
                    "remove the `if` and keep the branch you mean"
                )
            vals.append(v)
    if vals and vals[0] in ("[", "[[") and vals[-1] in ("]", "]]"):
        vals = vals[1:-1]
    else:
        raise RecipeError(
            f"line {no}: this `if` runs a command, whose result only a run knows; "
            "remove the `if` and keep the branch you mean"
        )
    if len(vals) == 3 and vals[1] in ("=", "==", "!="):
        return (vals[0] == vals[2]) == (vals[1] != "!=")
    if len(vals) == 2 and vals[0] in ("-z", "-n"):
        return (vals[1] == "") == (vals[0] == "-z")
    if len(vals) == 1:
        return vals[0] != ""
    raise RecipeError(
        f"line {no}: the test [ {' '.join(vals)} ] is not read here (only =, ==, !=, -z, -n); "
        "remove the `if` and keep the branch you mean"
    )


_Found = tuple[_Cmd, list[str | _Unknown], list[int]]


def _run(shell: _Shell, cmds: list[_Cmd], source: str) -> tuple[list[_Found], list[str]]:
    """Walk the statements as bash would: assignments, `if` on known values; return the commands
    left to run (expanded) and the lines that only prepare the host."""
    found: list[_Found] = []
    skipped: list[str] = []
    # stack of (branch taken so far, this branch active)
    stack: list[tuple[bool, bool]] = []
    k = 0
    while k < len(cmds):
        cmd = cmds[k]
        k += 1
        head = cmd.words[0]
        active = all(a for _, a in stack)
        if head in _KEYWORDS_REFUSED or re.match(r"^[A-Za-z_][A-Za-z0-9_]*\(\)$", head):
            what = _KEYWORDS_REFUSED.get(head, "a function")
            raise RecipeError(
                f"{source}: line {cmd.no}: {what} is not read here (what it runs depends on the run); "
                "write the trainer's command out and pass it after `--`"
            )
        if head in ("if", "elif"):
            words = list(cmd.words[1:])
            then_inline = False
            if words and words[-1] == "then":
                words, then_inline = words[:-1], True
            if head == "if":
                taken = active and _test_value(shell, words, cmd.no)
                stack.append((taken, taken))
            else:
                if not stack:
                    raise RecipeError(f"{source}: line {cmd.no}: elif without if")
                done, _ = stack.pop()
                outer = all(a for _, a in stack)
                now = outer and not done and _test_value(shell, words, cmd.no)
                stack.append((done or now, now))
            if not then_inline:
                if k >= len(cmds) or cmds[k].words[0] != "then":
                    raise RecipeError(f"{source}: line {cmd.no}: `if` without `then`")
                rest = cmds[k].words[1:]
                cmds[k] = _Cmd(cmds[k].no, rest) if rest else cmds[k]
                if not rest:
                    k += 1
            continue
        if head == "then":
            if len(cmd.words) > 1:
                cmds.insert(k, _Cmd(cmd.no, cmd.words[1:]))
            continue
        if head == "else":
            if not stack:
                raise RecipeError(f"{source}: line {cmd.no}: else without if")
            done, _ = stack.pop()
            stack.append((True, all(a for _, a in stack) and not done))
            if len(cmd.words) > 1:
                cmds.insert(k, _Cmd(cmd.no, cmd.words[1:]))
            continue
        if head == "fi":
            if not stack:
                raise RecipeError(f"{source}: line {cmd.no}: fi without if")
            stack.pop()
            continue
        if head in ("do", "done", "esac"):
            raise RecipeError(f"{source}: line {cmd.no}: `{head}` of a loop or case is not read here; write it out")
        if not active:
            continue
        words = list(cmd.words)
        lines = [cmd.line_of(j) for j in range(len(words))]
        if head in ("export", "declare", "local", "readonly"):
            words = words[1:]
            if words and words[0].startswith("-"):
                words = words[1:]
            for w in words:
                if _ASSIGN.match(w):
                    _assign(shell, w, cmd.no)
            continue
        prefix: dict[str, str | _Unknown] = {}
        while words and _ASSIGN.match(words[0]):
            lines.pop(0)
            name, _, raw = words.pop(0).partition("=")
            prefix[name] = _assign_value(shell, raw, cmd.no)
        if not words:
            shell.vars.update(prefix)
            continue
        if words[0] in _SHELL_ONLY or words[0] == "source" or words[0] == ".":
            if words[0] in ("source", "."):
                raise RecipeError(
                    f"{source}: line {cmd.no}: `{words[0]} {' '.join(words[1:])}` reads another file; "
                    "write its settings into the script"
                )
            continue
        expanded: list[str | _Unknown] = []
        at: list[int] = []
        for w, wl in zip(words, lines, strict=True):
            got = shell.expand(w, wl)
            expanded.extend(got)
            at.extend([wl] * len(got))
        found.append((cmd, expanded, at))
    if stack:
        raise RecipeError(f"{source}: an `if` is not closed with `fi`")
    return found, skipped


def _assign(shell: _Shell, word: str, no: int) -> None:
    name, _, raw = word.partition("=")
    shell.vars[name] = _assign_value(shell, raw, no)


def _assign_value(shell: _Shell, raw: str, no: int) -> str | _Unknown:
    if raw.startswith("("):  # an array
        return _Unknown(no, raw)
    vals = shell.expand(raw, no)
    bad = next((v for v in vals if isinstance(v, _Unknown)), None)
    if bad is not None:
        return bad
    return " ".join(str(v) for v in vals)  # an assignment is not split


# ---------------------------------------------------------------------------------------------
# the trainer's command and Hydra's overrides


def _trainer_args(words: Sequence[str | _Unknown]) -> tuple[str, int] | None:
    """(launcher, index of the trainer's first own argument) where `words` starts verl's
    trainer, else None."""
    plain = [w if isinstance(w, str) else "" for w in words]
    launcher, cut = "python3 -m", 0
    # `nohup`, `exec`, `time`, `env [VAR=value ...]` run the command after them as it is
    while cut < len(plain) and (plain[cut] in _PREFIXES or ("env" in plain[:cut] and _ASSIGN.match(plain[cut]))):
        cut += 1
    plain = plain[cut:]
    if plain[:3] == ["ray", "job", "submit"]:
        if "--" not in plain:
            return None
        after = plain.index("--") + 1
        cut += after
        plain, launcher = plain[after:], "ray job submit"
    k = 0
    if plain and (plain[0] == "torchrun" or plain[0].endswith("/torchrun")):
        # torchrun's own options (`--nproc_per_node 8`, `--standalone`) come before `-m MODULE`
        launcher = "torchrun"
        if "-m" not in plain:
            return None
        k = plain.index("-m") + 1
        return (launcher, cut + k + 1) if k < len(plain) and plain[k] == TRAINER else None
    if plain and _PYTHONS.match(plain[0]):
        k = 1
        while k < len(plain) and (plain[k] in ("-u", "-O", "-B", "-X") or plain[k][:2] == "-X"):
            k += 2 if plain[k] == "-X" else 1
        if k + 1 < len(plain) and plain[k] == "-m" and plain[k + 1] == TRAINER:
            return launcher, cut + k + 2
        return None
    if plain and plain[0] == TRAINER:
        return "verl.trainer.main_ppo", cut + 1
    return None


def _mentions_trainer(words: list[str | _Unknown]) -> bool:
    return any(isinstance(w, str) and ("main_ppo" in w or "verl.trainer" in w) for w in words)


def canonical(raw: str, where: str) -> tuple[str, str]:
    """(canonical `--set` line, key) of one trainer argument, as Hydra's own parser reads it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    try:
        (ov,) = OverridesParser.create().parse_overrides([raw])
    except HydraException as e:
        msg = " ".join(str(e).split())[:160]
        raise RecipeError(f"{where}: {raw!r} is not a Hydra override ({msg})") from None
    key = ov.key_or_group
    if ov.package:
        raise RecipeError(f"{where}: {raw!r}: a Hydra @package override is not read here; set the key itself")
    if ov.is_sweep_override():
        raise RecipeError(f"{where}: {raw!r} is a sweep (several runs); give one value")
    if ov.type == OverrideType.DEL:
        return f"~{key}", key
    prefix = {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}.get(ov.type, "")
    value: Any = ov.value()
    return f"{prefix}{key}={json.dumps(_plain(value))}", key


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


def _overrides(args: list[str | _Unknown], lines: list[int], source: str) -> tuple[str | None, list[Override]]:
    config_name: str | None = None
    out: list[Override] = []
    k = 0
    while k < len(args):
        a = args[k]
        no = line = lines[k]
        k += 1
        if isinstance(a, _Unknown):
            raise RecipeError(
                f"{source}: line {no}: an argument of the trainer comes from {a.text} (line {a.line}), "
                "known only when the script runs; write its value into the script, or give the command after --"
            )
        if a in ("--config-name", "--config-path", "-cn", "-cp"):
            if k >= len(args) or isinstance(args[k], _Unknown):
                raise RecipeError(f"{source}: line {no}: {a} without a value")
            val = str(args[k])
            k += 1
            if a in ("--config-name", "-cn"):
                config_name = val.removesuffix(".yaml")
            elif val.rstrip("/") not in VERL_CONFIG_PATHS:
                raise RecipeError(
                    f"{source}: line {no}: {a} {val}: a config folder of your own is not read here; "
                    "put its settings on the command line"
                )
            continue
        if a.startswith(("--config-name=", "--config-path=")):
            args[k - 1 : k] = a.split("=", 1)
            lines.insert(k, line)
            k -= 1
            continue
        if a.startswith("-"):
            raise RecipeError(f"{source}: line {no}: {a}: verl's trainer takes Hydra overrides (key=value), not {a}")
        text, key = canonical(a, f"{source}: line {line}")
        out.append(Override(text, key, line, a))
    return config_name, out


def read_text(
    text: str,
    source: str,
    env: Mapping[str, str] | None = None,
    args: Sequence[str] = (),
) -> VerlCommand:
    """The trainer call of a script's text; `args` are the caller's arguments (what `$@` gives),
    `env` the environment its `${VAR:-default}` reads (default: this process's)."""
    shell = _Shell(env=dict(os.environ) if env is None else env, args=list(args))
    try:
        found, skipped = _run(shell, _statements(text), source)
    except RecipeError as e:
        msg = str(e)
        raise RecipeError(msg if msg.startswith(source) else f"{source}: {msg}") from None
    calls = []
    for cmd, words, at in found:
        got = _trainer_args(words)
        if got is not None:
            calls.append((cmd, got[0], words[got[1] :], at[got[1] :]))
        elif _mentions_trainer(words):
            raise RecipeError(
                f"{source}: line {cmd.no}: verl's trainer is started in a way not read here; "
                f"start it as `python3 -m {TRAINER} key=value ...`"
            )
        else:
            skipped.append(f"line {cmd.no}: {' '.join(str(w) if isinstance(w, str) else w.text for w in words)}")
    if not calls:
        raise RecipeError(f"{source}: does not call verl's trainer (python3 -m {TRAINER} ...)")
    if len(calls) > 1:
        lines = ", ".join(str(c[0].no) for c in calls)
        raise RecipeError(f"{source}: calls verl's trainer more than once (lines {lines}); keep one call")
    cmd, launcher, targs, tlines = calls[0]
    config_name, overrides = _overrides(list(targs), list(tlines), source)
    return VerlCommand(source, cmd.no, launcher, config_name, tuple(overrides), tuple(skipped))


def read_script(path: Path, env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> VerlCommand:
    """`read_text` of a script file; a missing or unreadable file is one line."""
    if not path.is_file():
        raise RecipeError(f"{path}: no such file")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise RecipeError(f"{path}: not a text file") from None
    return read_text(text, str(path), env, args)


def read_argv(argv: Sequence[str]) -> VerlCommand:
    """The trainer call of a command line given after `--` (already split by the user's shell)."""
    got = _trainer_args(list(argv))
    if got is None:
        raise RecipeError(
            f"`{' '.join(argv[:4])}{' ...' if len(argv) > 4 else ''}` does not call verl's trainer: "
            f"give `-- python3 -m {TRAINER} key=value ...`"
        )
    launcher, start = got
    config_name, overrides = _overrides(list(argv[start:]), [0] * (len(argv) - start), "the command line")
    return VerlCommand("the command line", 0, launcher, config_name, tuple(overrides))
