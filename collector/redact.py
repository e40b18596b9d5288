"""Secret redaction for every piece of free text the collector outputs (DESIGN.md §7).

Tenants write event messages, condition messages, annotations and log lines, and they quote
tokens, keys, connection strings and passwords in them. Every output path (terminal, JSON,
metrics, ADX rows, evidence bundles) runs free text through `redact` first. Rules are named so a
bundle's REDACTIONS.md can say which rule fired where, never the value it replaced.

Every pattern here is linear-time on Python's engine: no nested quantifiers, bounded repeats, and
character classes that cannot overlap the literal that follows them. Input is cut at `MAX_TEXT`
characters before matching, so the cost per call is bounded too.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

MASK = "[REDACTED]"
# Free text longer than this is cut before redaction (with a marker): outputs never need more.
MAX_TEXT = 64 * 1024

_KEYWORDS = r"(?:password|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key|credentials?|auth)"


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    pattern: re.Pattern[str]
    # Builds the replacement from the match; None keeps the match (a false positive by content).
    replace: Callable[[re.Match[str]], str | None]


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


def _keyword_value(m: re.Match[str]) -> str | None:
    value = m.group("v") or ""
    # "tokens: 4096", "token_count=12", "auth=true": numbers and booleans are not secrets.
    bare = value.strip("\"'")
    if bare.startswith(MASK[:-1]):  # already masked by an earlier rule (the value class stops at "]")
        return None
    if len(bare) < 6 or bare.replace(".", "").replace(",", "").isdigit() or bare.lower() in (
            "true", "false", "none", "null", MASK.lower(), MASK[:-1].lower()):
        return None
    start, end = m.span("v")
    base = m.start(0)
    whole = m.group(0)
    return whole[: start - base] + MASK + whole[end - base:]


RULES: tuple[Rule, ...] = (
    Rule("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,4096}\.eyJ[A-Za-z0-9_-]{4,8192}\.[A-Za-z0-9_-]{0,4096}"), _mask_all),
    Rule("authorization-header",
         re.compile(r"(?i)\b(?:bearer|basic)[ \t]+([A-Za-z0-9._~+/=-]{8,4096})"), _mask_group(1)),
    Rule("url-credentials",
         re.compile(r"(?i)\b[a-z][a-z0-9+.-]{1,20}://([^/\s:@]{1,256}:[^/\s@]{1,256})@"), _mask_group(1)),
    Rule("sas-signature", re.compile(r"(?i)[?&](?:sig|signature|x-amz-signature)=([A-Za-z0-9%+/=_-]{8,1024})"),
         _mask_group(1)),
    Rule("connection-string-key",
         re.compile(r"(?i)\b(?:AccountKey|SharedAccessKey|SharedAccessSignature|Password|Pwd)=([^;\s\"']{1,1024})"),
         _mask_group(1)),
    Rule("aws-access-key", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"), _mask_all),
    Rule("github-token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,255}|github_pat_[A-Za-z0-9_]{22,255})"),
         _mask_all),
    Rule("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,255}"), _mask_all),
    Rule("api-key", re.compile(r"\b(?:sk-[A-Za-z0-9_-]{20,255}|hf_[A-Za-z0-9]{30,255}|AIza[0-9A-Za-z_-]{35})"),
         _mask_all),
    Rule("azure-storage-key", re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{86}=="), _mask_all),
    # key=value, key: value, "key": "value" where the key names a secret. The key may have a
    # prefix/suffix (DB_PASSWORD, clientSecret); the value ends at whitespace, quote or separator.
    Rule("secret-assignment",
         re.compile(r"(?i)\b[A-Za-z0-9_.-]{0,40}" + _KEYWORDS + r"[A-Za-z0-9_.-]{0,40}[\"']?[ \t]{0,4}[:=][ \t]{0,4}"
                    r"(?P<v>\"[^\"\r\n]{1,512}\"|'[^'\r\n]{1,512}'|[^\s,;\"'&}\]]{1,512})"),
         _keyword_value),
)

_PEM_BEGIN = "-----BEGIN "
_PEM_KEY_TAIL = "PRIVATE KEY-----"


def _redact_pem(text: str, counts: Counter[str]) -> str:
    """PEM private key blocks, found with str.find (no regex over unbounded bodies)."""
    if _PEM_BEGIN not in text:
        return text
    out: list[str] = []
    pos = 0
    while True:
        b = text.find(_PEM_BEGIN, pos)
        if b < 0:
            break
        head_end = text.find("-----", b + len(_PEM_BEGIN))
        if head_end < 0 or not text[b:head_end + 5].endswith(_PEM_KEY_TAIL) or head_end - b > 64:
            out.append(text[pos:b + len(_PEM_BEGIN)])
            pos = b + len(_PEM_BEGIN)
            continue
        end = text.find("-----END ", head_end + 5)
        stop = text.find("-----", end + 9) + 5 if end >= 0 else len(text)
        if end >= 0 and stop < end + 9 + 5:  # no closing dashes: the rest is key material
            stop = len(text)
        out.append(text[pos:b] + MASK)
        counts["private-key"] += 1
        pos = stop
    out.append(text[pos:])
    return "".join(out)


def _cut(text: str) -> str:
    if len(text) <= MAX_TEXT:
        return text
    return text[:MAX_TEXT] + f"…[cut {len(text) - MAX_TEXT} chars]"


def redact_counted(text: str) -> tuple[str, Counter[str]]:
    """The text with secrets masked, and how often each rule fired."""
    counts: Counter[str] = Counter()
    if not text:
        return text, counts
    out = _redact_pem(_cut(text), counts)
    for rule in RULES:
        def sub(m: re.Match[str], rule: Rule = rule) -> str:
            new = rule.replace(m)
            if new is None:
                return m.group(0)
            counts[rule.name] += 1
            return new

        out = rule.pattern.sub(sub, out)
    return out, counts


def redact(text: str) -> str:
    """The text with every secret-looking span replaced by [REDACTED]."""
    return redact_counted(text)[0]


@dataclass(slots=True)
class RedactionLog:
    """Where redaction fired, for a report (REDACTIONS.md): location, rule and count, never values."""

    entries: Counter[tuple[str, str]] = field(default_factory=Counter)

    def apply(self, text: str, where: str) -> str:
        out, counts = redact_counted(text)
        for rule, n in counts.items():
            self.entries[(where, rule)] += n
        return out

    def apply_all(self, texts: Iterable[str], where: str) -> list[str]:
        return [self.apply(t, where) for t in texts]

    def rows(self) -> list[tuple[str, str, int]]:
        return sorted((where, rule, n) for (where, rule), n in self.entries.items())
