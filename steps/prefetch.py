"""Download every Hugging Face hub asset a config names into the local HF cache.

    python -m steps.prefetch --configfile configs/gpu.yaml configs/hub.yaml [--config key=value ...]
    python -m steps.prefetch --configfile configs/gpu.yaml configs/hub.yaml --dry-run   # list only

The config is merged exactly as Snakemake merges it (configs/default.yaml, then each --configfile,
then --config, parsed by Snakemake's own parser) and validated against workflow/schemas/. The asset
list is the one the Snakefile checks while planning (steps/hub/), so after a successful prefetch
the same config plans offline. Assets already cached are skipped (running it twice downloads
nothing). Models: config, tokenizer files and one weights format (safetensors, else PyTorch .bin)
from the repository's top level, via huggingface_hub. Datasets: `datasets.load_dataset`, which
downloads and prepares the Arrow files that `load_dataset` reads back with HF_HUB_OFFLINE=1.
Where the hub cannot be reached it stops with one message (no traceback) and exit status 1.
Exit status: 0 every asset cached, 1 an asset missing (--dry-run) or not fetched, 2 a bad config.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from steps.config import ConfigError, validate_config
from steps.core.cli import parser as cli_parser
from steps.hub import Asset, config_layers, hub_assets, is_cached, prefetch_command

MODEL_SUFFIXES = (".json", ".txt", ".model", ".tiktoken", ".jinja")  # config, tokenizer, templates


class Unreachable(Exception):
    """The hub did not answer (offline mode, DNS, refused, timed out)."""


def parse_args(argv=None) -> argparse.Namespace:
    ap = cli_parser("python -m steps.prefetch", __doc__.split("\n\n")[0])
    ap.add_argument(
        "--configfile",
        "--configfiles",
        nargs="+",
        action="extend",
        default=[],
        metavar="FILE",
        help="config files merged on top of configs/default.yaml, in order (as for snakemake)",
    )
    ap.add_argument(
        "--config",
        "-C",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="overrides on top of the files (as for snakemake)",
    )
    ap.add_argument("--dry-run", "-n", action="store_true", help="list the assets and whether each is cached")
    return ap.parse_args(argv)


def merged_config(configfiles: list[str], entries: list[str]) -> tuple[dict, dict]:
    """(validated config, --config overrides) the way Snakemake builds them."""
    from snakemake.cli import parse_config
    from snakemake.utils import update_config

    for f in configfiles:
        if not Path(f).is_file():
            raise ConfigError(f"--configfile {f}: no such file (paths are relative to {Path.cwd()})")
    try:
        overrides = parse_config(entries)
    except ValueError as exc:
        raise ConfigError(f"--config {' '.join(entries)}: {exc}") from None
    cfg: dict = {}
    for _, data in config_layers(configfiles, overrides):
        update_config(cfg, data)
    return validate_config(
        cfg, where=", ".join(["configs/default.yaml", *configfiles]) + (" + --config" if overrides else "")
    ), overrides


_NETWORK_ERRORS = {
    "OfflineModeIsEnabled",
    "LocalEntryNotFoundError",
    "TransportError",
    "NetworkError",
    "ConnectError",
    "TimeoutException",
    "ConnectTimeout",
    "ReadTimeout",
    "ProxyError",
    "ConnectionError",
    "TimeoutError",
    "gaierror",
}  # huggingface_hub, httpx(2), requests, socket


def _unreachable(exc: BaseException) -> bool:
    """Does this exception (or one it was raised from) say the hub could not be reached at all?
    Matched by class name so that httpx, httpx2 and requests all count."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _NETWORK_ERRORS & {c.__name__ for c in type(exc).__mro__}:
            return True
        # `raise X from None` hides the context: a fallback's own network error is not the reason
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return False


def probe_hub() -> str | None:
    """None when the hub answers over HTTP (any status), else why not: one request, no retries
    (huggingface_hub's own calls retry a dead network for ~25 s each)."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set: unset it to download"
    try:
        get_session().head(constants.ENDPOINT, timeout=15)
    except Exception as exc:  # noqa: BLE001 - DNS, refused, proxy, TLS, timeout: all mean "not reachable"
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return None


def model_files(repo_files: list[str], asset: Asset) -> list[str]:
    """The files of a model repository that its loaders read: the top level's config, tokenizer and
    template files, plus one weights format (every safetensors shard, else the PyTorch .bin ones)
    when weights are needed; never TF/Flax/ONNX/Rust weights or subfolders."""
    files = [f for f in repo_files if "/" not in f]
    want = [f for f in files if f.endswith(MODEL_SUFFIXES)]
    if "weights" in asset.parts:
        weights = [f for f in files if f.endswith(".safetensors")]
        weights = weights or [f for f in files if f.startswith("pytorch_model") and f.endswith(".bin")]
        if not weights:
            raise RuntimeError(f"{asset.repo_id} has no *.safetensors or pytorch_model*.bin at its top level")
        want += weights
    return want


def fetch_model(asset: Asset) -> str:
    from huggingface_hub import HfApi, snapshot_download

    want = model_files(HfApi().list_repo_files(asset.repo_id), asset)
    return snapshot_download(asset.repo_id, allow_patterns=want)


def fetch_dataset(asset: Asset) -> str:
    import datasets

    dd = datasets.load_dataset(asset.repo_id, asset.name)
    return ", ".join(f"{split}: {len(ds):,} rows" for split, ds in dd.items())


def fetch(asset: Asset) -> str:
    try:
        return fetch_dataset(asset) if asset.kind == "dataset" else fetch_model(asset)
    except Exception as exc:  # noqa: BLE001 - classified: unreachable stops everything, else this asset fails
        if _unreachable(exc):
            raise Unreachable(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}") from None
        raise


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        config, overrides = merged_config(args.configfile, args.config)
    except ConfigError as exc:
        print(f"prefetch: {exc}", file=sys.stderr)
        return 2
    assets = hub_assets(config)
    command = prefetch_command(args.configfile, overrides)
    if not assets:
        print("prefetch: this config names no hub asset: nothing to download (it plans offline).")
        return 0
    from huggingface_hub import constants

    print(
        f"prefetch: {len(assets)} hub asset(s) named by {command.removeprefix('python -m steps.prefetch ')}; "
        f"cache: {constants.HF_HOME}"
    )
    todo = []
    for a in assets:
        cached = is_cached(a)
        print(f"  {'cached ' if cached else 'missing'}  {a.describe()}  <- {', '.join(a.used_by)}")
        if not cached:
            todo.append(a)
    if not todo:
        print("prefetch: every asset is cached; nothing to download.")
        return 0
    if args.dry_run:
        print(f"prefetch: {len(todo)} to download (dry run: nothing downloaded).")
        return 1
    endpoint = constants.ENDPOINT

    def unreachable(why: str, left: list[Asset]) -> int:
        rest = "\n".join(f"  - {b.describe()}" for b in left)
        print(
            f"prefetch: cannot reach the Hugging Face hub at {endpoint} ({why}).\nNot downloaded:\n{rest}\n"
            f"Fix: run `{command}` on a machine that reaches {endpoint} (with the same HF_HOME, or copy "
            "that HF_HOME here afterwards).",
            file=sys.stderr,
        )
        return 1

    if why := probe_hub():
        return unreachable(why, todo)
    failed = []
    for i, a in enumerate(todo):
        print(f"prefetch: downloading {a.describe()} from {endpoint} ...", flush=True)
        t0 = time.perf_counter()
        try:
            what = fetch(a)
        except Unreachable as exc:  # the hub went away mid-way
            return unreachable(str(exc), todo[i:])
        except Exception as exc:  # noqa: BLE001 - one asset failed (unknown repo, gated, ...): go on
            print(
                f"prefetch: FAILED {a.describe()} (needed by {', '.join(a.used_by)}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                file=sys.stderr,
            )
            failed.append(a)
            continue
        if not is_cached(a):  # what the Snakefile's check will look for
            print(
                f"prefetch: FAILED {a.describe()}: downloaded ({what}) but the cache still lacks what "
                "the loaders read; see steps/hub/cache.py is_cached",
                file=sys.stderr,
            )
            failed.append(a)
            continue
        print(f"prefetch: cached {a.describe()} in {time.perf_counter() - t0:.0f} s ({what})")
    if failed:
        print(
            f"prefetch: {len(failed)} of {len(todo)} asset(s) not fetched; fix the config keys named above "
            "(repo id, dataset name, access token for a gated repo: `hf auth login`).",
            file=sys.stderr,
        )
        return 1
    print(
        "prefetch: every asset is cached; the config now plans offline (export HF_HUB_OFFLINE=1 on a "
        "machine without network)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
