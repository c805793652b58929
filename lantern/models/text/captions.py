"""Caption preprocessing before the T5 encoder, as LlamaGen's text-to-image pipeline does it.

LlamaGen (``language/t5.py``, ``use_text_preprocessing=True``, its default) cleans every caption
twice with the caption cleaner of DeepFloyd IF / PixArt before tokenizing: URL-decoding, lower case,
URLs, HTML tags and entities, @handles, CJK characters, unified dashes and quotes, IP addresses,
file names, shop boilerplate, product codes and stray punctuation; ``ftfy`` repairs mojibake and
BeautifulSoup strips markup. FLAN-T5 therefore never sees upper case or markup, and the same prompt
must be cleaned the same way here to give the same token ids. Its other setting
(``use_text_preprocessing=False``) only lower-cases and strips.

Modes (``model.text_preprocessing``): ``clean`` (LlamaGen's default), ``lower`` (its other setting),
``none`` (the caption as given).
"""

from __future__ import annotations

import html
import re
import urllib.parse
import warnings
from collections.abc import Callable

from lantern import checks

MODES = ("clean", "lower", "none")
_EXTENSIONS = "png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4"
_TLDS = "com|co|ru|net|org|edu|gov|it"


def _sub(pattern: str, replacement: str, flags: int = 0) -> Callable[[str], str]:
    compiled = re.compile(pattern, flags)
    return lambda text: compiled.sub(replacement, text)


# Rules applied in order by one cleaning pass, before ftfy/HTML unescaping (each: text -> text).
_BEFORE_FIX = (
    _sub("<person>", "person"),
    # Links: an http(s) scheme, or a dotted host with one of a few top-level domains (twice: the
    # second rule is the same with "www:" as the scheme, kept because it is part of the behaviour).
    _sub(rf"\b((?:https?:(?:\/{{1,3}}|[a-zA-Z0-9%])|[a-zA-Z0-9.\-]+[.](?:{_TLDS})[\w/-]*\b\/?(?!@)))", ""),
    _sub(rf"\b((?:www:(?:\/{{1,3}}|[a-zA-Z0-9%])|[a-zA-Z0-9.\-]+[.](?:{_TLDS})[\w/-]*\b\/?(?!@)))", ""),
)
_AFTER_MARKUP = (
    _sub(r"@[\w\d]+\b", ""),  # @handles
    _sub(r"[\u31c0-\u9fff]+", ""),  # CJK strokes, kana extensions, enclosed letters, compatibility, ideographs
    # Every kind of dash becomes "-".
    _sub(
        r"[\u002D\u058A\u05BE\u1400\u1806\u2010-\u2015\u2E17\u2E1A\u2E3A\u2E3B\u2E40\u301C\u3030\u30A0"
        r"\uFE31\uFE32\uFE58\uFE63\uFF0D]+",
        "-",
    ),
    _sub("[`\u00b4\u00ab\u00bb\u201c\u201d\u00a8]", '"'),  # double-quote look-alikes
    _sub("[\u2018\u2019]", "'"),  # single curly quotes
    _sub(r"&quot;?", ""),
    _sub(r"&amp", ""),
    _sub(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),  # IP addresses
    _sub(r"\d:\d\d\s+$", ""),  # trailing article ids
    _sub(r"\\n", " "),  # a literal backslash-n
    _sub(r"#\d{1,3}\b", ""),
    _sub(r"#\d{5,}\b", ""),
    _sub(r"\b\d{6,}\b", ""),
    _sub(rf"[\S]+\.(?:{_EXTENSIONS})", ""),  # file names
    _sub(r"[\"']{2,}", '"'),
    _sub(r"[\.]{2,}", " "),
    _sub(
        "[#\u00ae\u2022\u00a9\u2122&@\u00b7\u00ba\u00bd\u00be\u00bf\u00a1\u00a7~\\)\\(\\]\\[\\}\\{\\|\\\\/\\*]{1,}", " "
    ),
    _sub(r"\s+\.\s+", " "),
)
_SEPARATORS = re.compile(r"(?:\-|\_)")
_AFTER_FIX = (
    _sub(r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),  # product codes: jc6640
    _sub(r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),  # jc6640vc
    _sub(r"\b\d+[a-zA-Z]+\d+\b", ""),  # 6640vc231
    _sub(r"(worldwide\s+)?(free\s+)?shipping", ""),
    _sub(r"(free\s)?download(\sfree)?", ""),
    _sub(r"\bclick\b\s(?:for|on)\s\w+", ""),
    _sub(rf"\b(?:{_EXTENSIONS})(\simage[s]?)?", ""),
    _sub(r"\bpage\s+\d+\b", ""),
    _sub(r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),  # j2d1a2a...
    _sub("\\b\\d+\\.?\\d*[x\u0445\u00d7]\\d+\\.?\\d*\\b", ""),  # sizes: 1920x1080 (Latin x, Cyrillic kha, times sign)
    _sub(r"\b\s+\:\s+", r": "),
    _sub(r"(\D[,\./])\b", r"\1 "),  # a space after punctuation glued to a word
    _sub(r"\s+", " "),
    _sub(r"^[\"']([\w\W]+)[\"']$", r"\1"),  # surrounding quotes
    _sub(r"^['\_,\-\:;]", ""),
    _sub(r"['\_,\-\:\-\+]$", ""),
    _sub(r"^\.\S+$", ""),
)


def _apply(rules, text: str) -> str:
    for rule in rules:
        text = rule(text)
    return text


def _fix_text(text: str) -> str:
    """Repair mojibake (ftfy), undo two levels of HTML escaping, strip."""
    import ftfy

    return html.unescape(html.unescape(ftfy.fix_text(text))).strip()


def clean_once(caption: str) -> str:
    """One pass of LlamaGen's caption cleaner over ``caption``."""
    from bs4 import BeautifulSoup, MarkupResemblesLocatorWarning

    text = urllib.parse.unquote_plus(str(caption)).strip().lower()
    text = _apply(_BEFORE_FIX, text)
    with warnings.catch_warnings():  # a caption that looks like a file name is still a caption
        warnings.simplefilter("ignore", MarkupResemblesLocatorWarning)
        text = BeautifulSoup(text, features="html.parser").text  # drop markup, keep its text
    text = _apply(_AFTER_MARKUP, text)
    if len(_SEPARATORS.findall(text)) > 3:  # this-is-a-slug / this_is_a_slug -> words
        text = _SEPARATORS.sub(" ", text)
    text = _fix_text(text)
    return _apply(_AFTER_FIX, text).strip()


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES`, else ConfigError."""
    return checks.choice("model.text_preprocessing", mode, MODES, note="clean: LlamaGen's default caption cleaning")


def preprocess(caption: str, mode: str = "clean") -> str:
    """``caption`` as LlamaGen hands it to the tokenizer: cleaned twice (``clean``), lower-cased and
    stripped (``lower``) or unchanged (``none``)."""
    check_mode(mode)
    if mode == "clean":
        return clean_once(clean_once(caption))
    if mode == "lower":
        return caption.lower().strip()
    return caption
