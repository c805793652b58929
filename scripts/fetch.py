"""Fetch, pin and verify every file a run reads: the same overrides as run.py, composed the same way.

    python scripts/fetch.py model=llamagen_t2i_xl_256 protocol=lantern_coco17_5k          # download what is missing
    python scripts/fetch.py model=llamagen_t2i_xl_256 protocol=lantern_coco17_5k --list   # source, size, pin, place
    python scripts/fetch.py model=llamagen_t2i_xl_256 decoding=ar                         # no drafter for AR
    python scripts/fetch.py model=emu3_gen decoding=ar --read-timeout=120                 # a slow link

Options: --list, --no-progress, --connect-timeout=SECONDS (default 10), --read-timeout=SECONDS (default 30: a
server that accepts and never answers fails within it; a download that stalls that long is given up with
"rerun to resume", and a rerun resumes it).

Files land under paths.assets (LANTERN_ASSETS or <repo>/assets), where the presets' path defaults point.
The drafter is fetched when the composed decoder uses one (the default, lantern, does). Each file is
checked against its pins (a verified one refuses, an unverified one warns) and recorded in
paths.assets/assets.lock.json on its first fetch (with the commit a hub branch resolved to), then checked against
that on every later fetch and run. Downloads resume (rerun after a dropped connection,
Ctrl-C or a full disk); with no network, or HF_HUB_OFFLINE=1, a missing file is one error line naming its
source and its place (copy it there). Derived files (the protocol's prompt list, the FID reference folder)
are made from their inputs. Bad input or a failed fetch: one `error:` line, exit 2.
"""

from __future__ import annotations

import sys

from lantern import REPO_ROOT
from lantern.cli.main import run_or_exit, use_cache_folder


def compose_run_config(overrides: list[str]) -> dict:
    """The config run.py would compose from ``overrides``, resolved (values left ``???`` stay so)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)


TIMEOUT_OPTIONS = ("--connect-timeout", "--read-timeout")


def _timeouts(options: list[str]) -> dict:
    """``--connect-timeout=S`` / ``--read-timeout=S`` as keyword arguments of ``urls.set_timeouts``."""
    from lantern import checks

    found = {}
    for option in options:
        name, _, value = option.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = value
        found[name[2:].split("-")[0]] = checks.real(name, seconds, 0.1, 3600.0)
    return found


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return
    show = "--list" in argv
    quiet = "--no-progress" in argv
    timed = [a for a in argv if a.split("=")[0] in TIMEOUT_OPTIONS]
    overrides = [a for a in argv if a not in ("--list", "--no-progress") and a not in timed]
    unknown = [a for a in overrides if a.startswith("-")]

    def task() -> None:
        from lantern.errors import ConfigError
        from lantern.run.assets import fetching, listing, urls

        if unknown:
            raise ConfigError(
                f"unknown option {unknown[0]!r}; options: --list, --no-progress, --connect-timeout=S, "
                "--read-timeout=S (and run.py overrides)"
            )
        urls.set_timeouts(**_timeouts(timed))
        resolved = compose_run_config(overrides)
        use_cache_folder(resolved)  # the hashes of what is fetched and checked, under paths.cache
        if show:
            print("\n".join(listing.listing(resolved)))
        else:
            fetching.fetch(resolved, progress=not quiet)

    run_or_exit(task)


if __name__ == "__main__":
    main()
