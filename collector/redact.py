"""Secret redaction for every piece of free text the collector outputs (DESIGN.md §7).

Tenants write event messages, condition messages, annotations and log lines, and they quote
tokens, keys, connection strings and passwords in them. Every output path (terminal, JSON,
metrics, ADX rows, evidence bundles) runs free text through `redact` first. Rules are named so a
bundle's REDACTIONS.md can say which rule fired where, never the value it replaced.

Two kinds of rule:
- by content: token formats (JWT, GitHub, Slack, AWS, ...), URL passwords, SAS signatures,
  webhook URLs, Sentry DSNs, PEM/PGP private key blocks;
- by name: when a key, environment variable or command-line flag names a secret (`DB_PASS`,
  `KAGGLE_KEY`, `--password`, `-p`), its whole value is masked, whatever the value looks like
  (short, numeric, punctuation first, holding spaces). `is_secret_name` is the one judge of
  names, for text here and for structured objects (exporters/bundles/scrub.py).

Operators add their own rules in settings (`redaction.patterns`, RE2; `redaction.keys`, names
with `*` globs); `install` makes them part of every call.

Every pattern here is linear-time on Python's engine: no nested quantifiers, bounded repeats or
single classes, and character classes that cannot overlap the literal that follows them; values
are matched anchored, once, and the scan moves past them. User patterns run on RE2. Input is cut
at `MAX_TEXT` characters before matching (callers with larger bounded text pass `limit`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import re2

MASK = "[REDACTED]"
# Free text longer than this is cut before redaction (with a marker): outputs never need more.
MAX_TEXT = 64 * 1024
MAX_NAME = 128  # longer names are judged by their first characters
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False

# --- names that hold secrets ---------------------------------------------------------------------

# Words of a name: DB_PASS → db pass; clientSecret → client secret; AZUREOpenAIKey → azure open ai key.
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
_PASS_PARTS = ("password", "passwd", "passphrase", "passcode", "passwort")
_NOT_PASS = frozenset({"bypass", "compass", "surpass", "overpass", "underpass", "trespass", "impass"})
# Last words that make a name a secret's (`*_KEY`, `*_TOKEN`, `*Secret`), unless qualified as plain below.
_SECRET_LAST = frozenset({"key", "token", "secret", "credential", "credentials", "cookie", "authorization",
                          "apikey", "accesskey", "secretkey", "privatekey", "signingkey", "masterkey",
                          "encryptionkey", "accountkey", "storagekey", "sshkey", "licensekey", "passkey",
                          "subscriptionkey", "connstr", "connectionstring", "basicauth", "sasurl"})
# `topologyKey`, `sort_key`, `SSH_PUBLIC_KEY`; `eos_token`, `max_tokens` (plural is never a secret)
_PLAIN_BEFORE_KEY = frozenset({"topology", "sort", "partition", "primary", "foreign", "cache", "label", "group",
                               "row", "shard", "routing", "lookup", "index", "node", "match", "selector",
                               "metric", "column", "public", "pub", "hash", "join", "dedup", "map", "dict",
                               "range", "field", "idempotency", "object", "sharding"})
_PLAIN_BEFORE_TOKEN = frozenset({"eos", "bos", "pad", "unk", "sep", "cls", "mask", "special", "start", "end",
                                 "stop", "max", "min", "num", "total", "page", "next", "continue", "continuation",
                                 "vocab", "first", "last"})
_SHELL_DIRS = frozenset({"pwd", "oldpwd"})  # the shell's working directory, not a password


@lru_cache(maxsize=8192)
def _builtin_secret_name(name: str) -> bool:
    words = [w.lower() for w in _WORDS.findall(name[:MAX_NAME])]
    if not words:
        return False
    for w in words:
        if any(p in w for p in _PASS_PARTS) or w == "pass" or (w.endswith("pass") and w not in _NOT_PASS):
            return True
        if w == "pwd" and len(words) > 1:
            return True
        if w in ("sas", "dsn") or w.endswith("dsn") or "webhook" in w:
            return True
    if len(words) == 1 and words[0] in _SHELL_DIRS:
        return False
    last, prev = words[-1], (words[-2] if len(words) > 1 else "")
    if last == "key":
        return bool(prev) and prev not in _PLAIN_BEFORE_KEY  # `key` alone: a toleration's or selector's
    if last == "token":
        return prev not in _PLAIN_BEFORE_TOKEN
    if last in _SECRET_LAST or (prev, last) in (("connection", "string"), ("basic", "auth")):
        return True
    for glued in ("token", "secret"):  # hftoken, appsecret; not padtoken
        if len(last) > len(glued) and last.endswith(glued):
            return last[: -len(glued)] not in _PLAIN_BEFORE_TOKEN
    return False


# --- rules by content ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    # Builds the replacement from the match; None keeps the match (a false positive by content).
    replace: Callable[[re.Match[str]], str | None]
    # The rule runs only on text holding one of these (lowercase: looked for case-insensitively):
    # a substring test costs far less than a regex scan that finds nothing.
    needles: tuple[str, ...] = ()


def _mask_group(n: int) -> Callable[[re.Match[str]], str | None]:
    """Keep everything of the match but group n, which becomes MASK."""

    def repl(m: re.Match[str]) -> str | None:
        if m.group(n) == MASK:  # already redacted: redaction is idempotent
            return None
        start, end = m.span(n)
        whole = m.group(0)
        base = m.start(0)
        return whole[: start - base] + MASK + whole[end - base:]

    return repl


def _mask_all(m: re.Match[str]) -> str:
    return MASK


_TOKENISH = re.compile(r"[A-Za-z0-9._~+/=%-]{16,512}")


def _url_userinfo(m: re.Match[str]) -> str | None:
    """user:password@ (the password may hold `@`: the userinfo ends at the authority's last `@`)."""
    info = m.group(1)
    user, colon, password = info.partition(":")
    if colon:
        if not password or password == MASK:
            return None
        new = f"{user}:{MASK}"
    elif info != MASK and _TOKENISH.fullmatch(info):  # a token as the user name (Sentry, git over https)
        new = MASK
    else:
        return None  # ssh://git@host, https://user@host
    return m.group(0)[: m.start(1) - m.start(0)] + new + "@"


RULES: tuple[Rule, ...] = (
    Rule("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{4,8192}\.[A-Za-z0-9_-]{0,4096}"), _mask_all,
         ("eyJ",)),
    Rule("authorization-header",
         re.compile(r"(?i)\b(?:bearer|basic)[ \t]+([A-Za-z0-9._~+/=-]{8,4096})"), _mask_group(1),
         ("bearer", "basic")),
    Rule("aws-access-key", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), _mask_all, ("AKIA", "ASIA")),
    Rule("github-token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{22,255})"),
         _mask_all, ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
    Rule("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,255}"), _mask_all, ("xox",)),
    Rule("api-key", re.compile(r"\b(?:sk-[A-Za-z0-9_-]{20,255}|hf_[A-Za-z0-9]{30,255}|AIza[0-9A-Za-z_-]{35}|"
                               r"glpat-[A-Za-z0-9_-]{20,255}|npm_[A-Za-z0-9]{36}|pypi-AgE[A-Za-z0-9_-]{50,255})"),
         _mask_all, ("sk-", "hf_", "AIza", "glpat-", "npm_", "pypi-")),
    Rule("azure-storage-key", re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{86}=="), _mask_all, ("==",)),
    Rule("sentry-dsn", re.compile(r"(?i)\bhttps?://([0-9a-f]{32}(?::[0-9a-f]{32})?)@[a-z0-9.-]{1,253}"),
         _mask_group(1), ("@",)),
    Rule("webhook-url",
         re.compile(r"(?i)\bhttps://(?:hooks\.slack\.com/(?:services|workflows|triggers)/|"
                    r"(?:[a-z0-9-]{1,63}\.)?discord(?:app)?\.com/api/webhooks/|"
                    r"[a-z0-9-]{1,63}\.webhook\.office\.com/webhookb2/)([^\s\"'<>]{8,2048})"), _mask_group(1),
         ("hooks.slack.com", "discord", "webhook.office.com")),
    Rule("url-credentials",
         re.compile(r"(?i)\b[a-z][a-z0-9+.-]{1,20}://([^/\s?#\"'<>]{1,512})@"), _url_userinfo, ("@",)),
    # SAS and presigned-URL signatures, after `?`/`&` or starting a value (`sig=...` pasted alone)
    Rule("sas-signature",
         re.compile(r"(?i)(?<![A-Za-z0-9_.-])(?:sig|signature|x-amz-signature|x-goog-signature)=([^&\s\"'<>]{1,2048})"),
         _mask_group(1), ("sig=", "signature=")),
    Rule("connection-string-key",
         re.compile(r"(?i)\b(?:AccountKey|SharedAccessKey|SharedAccessSignature|Password|Pwd)=([^;\s\"']{1,1024})"),
         _mask_group(1), ("accountkey=", "sharedaccess", "password=", "pwd=")),
)

# --- rules by name: key = value, key: value, --flag value ---------------------------------------

# One scan finds names with their separator; the value is then matched anchored where it starts.
_NAMED = re.compile(
    r"(?<![A-Za-z0-9_.-])(?:"
    r"(?P<flag>--?[A-Za-z][A-Za-z0-9_-]{0,62})(?P<fsep>=|[ \t]{1,4}|[\"'],[ \t]{0,2})"
    r"|(?P<glued>-p)(?=[^\s\"'=-])"  # mysql's -pSECRET, where the flag pattern stops early (-pMy$ecret)
    r"|(?P<key>[A-Za-z_][A-Za-z0-9_.-]{0,80})(?P<q>[\"']?)(?:[ \t]{0,4}(?P<eq>=)(?!=)|(?P<colon>:)(?![:/]))"
    r"[ \t]{0,4})")
_RUN = re.compile(r"[A-Za-z0-9_.-]*")
# A word of every name is_secret_name accepts, or the flags judged by their letter (-p, -u, --user):
# where a name may need judging. A hint may swallow the start of the next (`-p` of `db-pass`): each
# stands for its whole run of name characters.
# Searched in the lowercased text: Python's engine tries a case-insensitive alternation at every
# position (~20x slower); the (?i) form serves text whose lowercase changes length (U+0130).
_HINTS = re.compile(r"pass|pwd|secret|token|key|sas|dsn|webhook|credential|cookie|auth|conn|-p|-u")
_HINTS_ANY_CASE = re.compile("(?i)" + _HINTS.pattern)
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_V_WORD = re.compile(r"[^\s\"'&]+")  # key=value, --flag value: up to a blank, a quote or the next query pair
_V_JSONISH = re.compile(r"[^\s,}\]\"']+")  # "key": value
_V_LINE = re.compile(r"[^\r\n]+")  # key: value (YAML, headers, free text): the rest of the line
_V_BLOCK = re.compile(r"[|>][-+0-9]{0,3}[ \t]*(?:\r?\n[ \t][^\r\n]*){1,256}")  # YAML `key: |` and its lines
# -p: a password for mysql/sshpass, a port for docker/psql/ssh, a flag for mkdir/cp
_PORTLIKE = re.compile(r"[0-9][0-9.:-]{0,40}(?:/(?:tcp|udp|sctp))?")
_NOT_A_VALUE = ("-", "/", "./", "../", "~", "$", "&", "|", ";", ">", "<", "(", ")")
_MYSQL = re.compile(r"\b(?:mysql|mysqldump|mysqladmin|mariadb|mariadb-dump|mysqlsh)\b")
_USER_FLAGS = frozenset({"u", "user", "auth", "basic-auth", "proxy-user"})  # user:password
_P_FLAG_COMMANDS = ("mkdir", "cp", "install", "rsync", "scp")  # -p is not an option with a value there


def flag_value(flag: str, value: str, before: str = "") -> str | None:
    """The masked form of `value`, the argument after `flag` (argv lists, text), or None when it is
    not a secret (`value` itself when it is one, masked already).

    `before` is the text before the flag (the command it belongs to)."""
    name = flag.lstrip("-")
    if not flag.startswith("-") or value in ("", MASK) or value.startswith("--"):
        return None
    if name in _USER_FLAGS:
        user, colon, password = value.partition(":")
        if not colon or not password:
            return None
        return value if password == MASK else f"{user}:{MASK}"  # unchanged: handled, look past it
    if name == "p":
        if value.startswith(_NOT_A_VALUE) or _PORTLIKE.fullmatch(value):
            return None
        words = before[-32:].split()
        return None if words and words[-1].strip("\"'") in _P_FLAG_COMMANDS else MASK
    return MASK if is_secret_name(name) else None


def _unquote(value: str) -> tuple[str, str]:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1], value[0]
    return value, ""


def _quoted_end(text: str, at: int) -> int:
    """The end of the quoted string opening at `at` (a backslash escapes in double quotes), within its
    line; -1 when it does not close there. str.find, not a regex: a search for an unclosed quote
    would start again at every quote of a line."""
    quote = text[at]
    eol = text.find("\n", at + 1)
    eol = len(text) if eol < 0 else eol
    i = at + 1
    while (j := text.find(quote, i, eol)) >= 0:
        k = j
        while quote == '"' and k > i and text[k - 1] == "\\":
            k -= 1
        if (j - k) % 2 == 0:
            return j + 1
        i = j + 1
    return -1


def _value_span(text: str, at: int, plain: re.Pattern[str] | None) -> tuple[int, int] | None:
    """Where the value starting at `at` ends: a quoted string, else `plain`'s match (None: quoted only)."""
    if text.startswith(MASK, at):  # masked by an earlier rule or pass: only what follows it is new
        rest = plain.match(text, at + len(MASK)) if plain is not None else None
        return at, rest.end() if rest else at + len(MASK)
    if at < len(text) and text[at] in "\"'":
        end = _quoted_end(text, at)
        if end < 0:  # an unclosed quote: the rest of the line
            m = _V_LINE.match(text, at)
            return (at, m.end()) if m else None
        return at, end
    m = plain.match(text, at) if plain is not None else None
    return (m.start(), m.end()) if m else None


_NOT_SECRETS = frozenset({"", "true", "false", "null", "none"})  # a boolean or nothing hides no secret


def _masked(value: str) -> str | None:
    """MASK in place of a value (quotes kept), or None when it is masked already, empty or a boolean."""
    inner, quote = _unquote(value)
    return None if inner.strip().lower() in _NOT_SECRETS or inner.strip() == MASK else quote + MASK + quote


def _named_value(text: str, m: re.Match[str], secret_name: Callable[[str], bool]
                 ) -> tuple[tuple[int, int] | None, str | None, str]:
    """(the value's span, its replacement or None, the rule) for one name the scan found."""
    pos = m.end()
    before = text[max(0, m.start() - 64):m.start()]
    flag = m.group("flag")
    glued = m.group("glued") or (flag is not None and len(flag) > 2 and flag[1] == "p" and flag[:2] != "--")
    if glued and _MYSQL.search(text, max(0, m.start() - 256), m.start()):
        span = _value_span(text, m.start() + 2, _V_WORD)
        return span, (_masked(text[span[0]:span[1]]) if span else None), "secret-flag"
    if flag is not None:
        # ["--password", "value"]: the value is the next quoted element
        span = _value_span(text, pos, None if "," in m.group("fsep") else _V_WORD)
        if span is None:
            return None, None, ""
        inner, quote = _unquote(text[span[0]:span[1]])
        repl = flag_value(flag, inner, before)
        return span, (None if repl is None else quote + repl + quote), "secret-flag"
    key = m.group("key")
    if key is None or not secret_name(key):
        return None, None, ""
    if m.group("q"):
        span = _value_span(text, pos, _V_JSONISH)
    elif m.group("eq"):
        span = _value_span(text, pos, _V_WORD)
    else:
        block = _V_BLOCK.match(text, pos)
        span = (pos, block.end()) if block else _value_span(text, pos, _V_LINE)
    return span, (_masked(text[span[0]:span[1]]) if span else None), "secret-assignment"


def _name_starts(text: str) -> Iterator[int]:
    """Where a name the scan must judge may start, in order.

    Most names of a log line are `loss:`, `step=`: only the runs of name characters holding a
    word of a secret's name, and dashes (flags), are looked at."""
    folded = text.lower()
    hints = _HINTS.finditer(folded) if len(folded) == len(text) else _HINTS_ANY_CASE.finditer(text)
    skip = 0
    for h in hints:
        at = h.start()
        if at < skip:
            continue
        if text[at] == "-" and (at == 0 or text[at - 1] not in _KEY_CHARS or text[at - 1] == "-"):
            yield at - 1 if at > 0 and text[at - 1] == "-" else at  # a flag: -p, --token
            continue
        start, floor = at, max(0, at - 81)  # a name: from the start of its run of name characters
        while start > floor and text[start - 1] in _KEY_CHARS:
            start -= 1
        yield start
        run = _RUN.match(text, at)
        skip = run.end() if run else at + 1  # one look per run of name characters


def _redact_named(text: str, counts: Counter[str], secret_name: Callable[[str], bool], every_key: bool) -> str:
    """Mask the values of secrets' names. With operator key names (any name may be one) every
    position is searched; else only where _name_starts points."""
    out: list[str] = []
    done = pos = 0
    starts = _name_starts(text)
    while True:
        if every_key:
            m = _NAMED.search(text, pos)
        else:
            m = None
            for at in starts:
                if at >= pos and (m := _NAMED.match(text, at)) is not None:
                    break
        if m is None:
            break
        pos = m.end()
        span, new, rule = _named_value(text, m, secret_name)
        if span is None or new is None:
            if span is not None and _unquote(text[span[0]:span[1]])[0] == MASK:
                pos = span[1]  # masked already: nothing to find inside
            continue  # not a secret: names inside the value are looked at too (--verbose password=x)
        start, end = span
        pos = end  # never look for names inside a masked value
        if new != text[start:end]:
            out.append(text[done:start])
            out.append(new)
            done = end
            counts[rule] += 1
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


# --- key blocks ----------------------------------------------------------------------------------

_PEM_BEGIN = "-----BEGIN "
_PEM_KEY_TAILS = ("PRIVATE KEY-----", "PRIVATE KEY BLOCK-----")  # PEM (RSA, EC, OPENSSH, ...) and PGP
MAX_KEY_BLOCK = 64 * 1024  # a block without its END line is masked this far (the largest keys are ~13 KB)


def _redact_pem(text: str, counts: Counter[str]) -> str:
    """PEM and PGP private key blocks, found with str.find (no regex over unbounded bodies)."""
    if _PEM_BEGIN not in text:
        return text
    out: list[str] = []
    pos = 0
    while True:
        b = text.find(_PEM_BEGIN, pos)
        if b < 0:
            break
        head_end = text.find("-----", b + len(_PEM_BEGIN))
        if head_end < 0 or not text[b:head_end + 5].endswith(_PEM_KEY_TAILS) or head_end - b > 64:
            out.append(text[pos:b + len(_PEM_BEGIN)])
            pos = b + len(_PEM_BEGIN)
            continue
        end = text.find("-----END ", head_end + 5, head_end + 5 + MAX_KEY_BLOCK)
        stop = text.find("-----", end + 9) + 5 if end >= 0 else min(len(text), head_end + 5 + MAX_KEY_BLOCK)
        if end >= 0 and stop < end + 9 + 5:  # no closing dashes: the rest is key material
            stop = min(len(text), end + MAX_KEY_BLOCK)
        out.append(text[pos:b] + MASK)
        counts["private-key"] += 1
        pos = stop
    out.append(text[pos:])
    return "".join(out)


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    # Cut at a blank near the limit, so that no token is kept in part.
    blank = max(text.rfind(" ", limit - 512, limit), text.rfind("\n", limit - 512, limit))
    at = blank if blank > 0 else limit
    return text[:at] + f"…[cut {len(text) - at} chars]"


# --- the redactor: built-in rules plus the operator's ---------------------------------------------

_GLOB = re.compile(r"[*?]|[^*?]+")


def _glob_re2(glob: str) -> str:
    return "".join(".*" if p == "*" else "." if p == "?" else re2.escape(p) for p in _GLOB.findall(glob))


@dataclass(frozen=True, slots=True)
class Redactor:
    """The rules applied to text: the built-in ones, plus RE2 patterns and secret names from settings."""

    patterns: tuple[Any, ...] = ()  # compiled RE2; a group named `mask` limits what is masked
    keys: Any = None  # compiled RE2 matching whole names (case-insensitive globs), or None

    def is_secret_name(self, name: str) -> bool:
        if _builtin_secret_name(name):
            return True
        return self.keys is not None and self.keys.fullmatch(name[:MAX_NAME]) is not None

    def redact_counted(self, text: str, *, limit: int = MAX_TEXT) -> tuple[str, Counter[str]]:
        if not text:
            return text, Counter()
        if len(text) <= _CACHED_TEXT:  # object fields repeat (every version of every pod): judged once
            out, counted = _redact_short(self, text)
            return out, Counter(dict(counted))
        return self._redact(text, limit)

    def _redact(self, text: str, limit: int) -> tuple[str, Counter[str]]:
        counts: Counter[str] = Counter()
        out = _redact_pem(_cut(text, limit), counts)
        folded = out.lower()  # replacements only ever remove needles: one look at the text serves every rule
        for rule, exact, lower in _PLAN:
            if (exact or lower) and not (any(n in out for n in exact) or any(n in folded for n in lower)):
                continue

            def sub(m: re.Match[str], rule: Rule = rule) -> str:
                new = rule.replace(m)
                if new is None or new == m.group(0):
                    return m.group(0)
                counts[rule.name] += 1
                return new

            out = rule.pattern.sub(sub, out)
        out = _redact_named(out, counts, self.is_secret_name, self.keys is not None)
        for i, rx in enumerate(self.patterns):
            out = _custom_sub(rx, f"custom-pattern-{i + 1}", out, counts)
        return out, counts


_CACHED_TEXT = 256
# Each rule with its needles, split into those looked for as they are and those looked for in lowercase.
_PLAN = tuple((r, tuple(n for n in r.needles if not n.islower()), tuple(n for n in r.needles if n.islower()))
              for r in RULES)


@lru_cache(maxsize=4096)
def _redact_short(redactor: Redactor, text: str) -> tuple[str, tuple[tuple[str, int], ...]]:
    out, counts = redactor._redact(text, MAX_TEXT)
    return out, tuple(counts.items())


def _custom_sub(rx: Any, name: str, text: str, counts: Counter[str]) -> str:
    group = rx.groupindex.get("mask", 0)

    def sub(m: Any) -> str:
        whole: str = m.group(0)
        start, end = m.start(group), m.end(group)
        if start < 0 or m.group(group) in ("", MASK):
            return whole
        counts[name] += 1
        base = m.start(0)
        return whole[: start - base] + MASK + whole[end - base:]

    out: str = rx.sub(sub, text)
    return out


def compile_rules(patterns: Iterable[str], keys: Iterable[str]) -> Redactor:
    """A Redactor with the operator's rules; ValueError names a pattern RE2 refuses."""
    compiled = []
    for p in sorted(patterns):
        try:
            rx = re2.compile(p, _RE2_OPTIONS)
        except re2.error as e:
            why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
            raise ValueError(f"redaction pattern {p!r} does not compile (RE2 syntax, no lookaround or "
                             f"backreferences): {why}") from e
        if rx.search("") is not None:
            raise ValueError(f"redaction pattern {p!r} matches empty text")
        compiled.append(rx)
    names = sorted(k for k in keys if k.strip("*?"))
    key_rx = re2.compile("(?i)(?:" + "|".join(_glob_re2(k) for k in names) + ")", _RE2_OPTIONS) if names else None
    return Redactor(tuple(compiled), key_rx)


_active = Redactor()


def install(redactor: Redactor) -> Redactor:
    """Make `redactor` the one every call uses (settings load time); returns the one it replaces."""
    global _active
    previous, _active = _active, redactor
    return previous


def active() -> Redactor:
    return _active


def is_secret_name(name: str) -> bool:
    """Does this key, environment variable or flag name (without dashes) name a secret?"""
    return _active.is_secret_name(name)


def redact_counted(text: str, *, limit: int = MAX_TEXT) -> tuple[str, Counter[str]]:
    """The text with secrets masked, and how often each rule really replaced something."""
    return _active.redact_counted(text, limit=limit)


def redact(text: str) -> str:
    """The text with every secret-looking span replaced by [REDACTED]."""
    return _active.redact_counted(text)[0]


def redact_key_blocks(text: str) -> tuple[str, Counter[str]]:
    """Only the private key blocks of a text of any length (before it is cut into chunks at lines)."""
    counts: Counter[str] = Counter()
    return _redact_pem(text, counts), counts


@dataclass(slots=True)
class RedactionLog:
    """Where redaction fired, for a report (REDACTIONS.md): location, rule and count, never values."""

    entries: Counter[tuple[str, str]] = field(default_factory=Counter)

    def apply(self, text: str, where: str, *, limit: int = MAX_TEXT) -> str:
        out, counts = redact_counted(text, limit=limit)
        self.add(where, counts)
        return out

    def add(self, where: str, counts: Counter[str]) -> None:
        for rule, n in counts.items():
            self.entries[(where, rule)] += n

    def masked(self, where: str, rule: str) -> None:
        """One value masked by its name in a structure (not by a text rule)."""
        self.entries[(where, rule)] += 1

    def apply_all(self, texts: Iterable[str], where: str) -> list[str]:
        return [self.apply(t, where) for t in texts]

    def rows(self) -> list[tuple[str, str, int]]:
        return sorted((where, rule, n) for (where, rule), n in self.entries.items())
