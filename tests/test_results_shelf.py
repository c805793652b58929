"""results/ is a shelf: one current file set per benchmark and table, each named in results/README.md, and no
committed file names a machine's absolute path."""

import re

from lantern import REPO_ROOT

RESULTS = REPO_ROOT / "results"
# An absolute path of a machine: /work/..., /home/..., /tmp/..., /root/..., /Users/..., /mnt/...
ABSOLUTE = re.compile(r"(?<![\w.~$])/(?:work|home|tmp|root|Users|mnt|scratch)/")


def shelf() -> list:
    return sorted(p for p in RESULTS.rglob("*") if p.is_file() and p.name != "README.md")


def test_no_result_names_an_absolute_path():
    found = {}
    for path in shelf():
        if path.suffix == ".png":
            continue
        hits = ABSOLUTE.findall(path.read_text(encoding="utf-8"))
        if hits:
            found[path.relative_to(RESULTS).as_posix()] = len(hits)
    assert found == {}


def test_every_result_file_is_named_in_the_readme():
    readme = (RESULTS / "README.md").read_text(encoding="utf-8")
    named = set()
    for cell in re.findall(r"^\| `([^|]+)` \|", readme, flags=re.M):  # the table's first column
        for name in re.findall(r"`?([\w./*{},-]+)`?", cell):
            named.add(name)
    missing = []
    for path in shelf():
        stem, suffix = path.relative_to(RESULTS).as_posix().rsplit(".", 1)
        listed = any(
            re.fullmatch(
                re.escape(n).replace(r"\*", "[^/]*").replace(r"\{", "(?:").replace(r"\}", ")").replace(",", "|"),
                f"{stem}.{suffix}",
            )
            for n in named
        )
        if not listed:
            missing.append(f"{stem}.{suffix}")
    assert missing == []
