"""Makes this Python a client-only install of raytrain: with this folder on PYTHONPATH, the
packages the `server` extra brings (pyproject.toml) cannot be imported, as after a plain
`pip install raytrain` (tests/service/test_client_install.py)."""

import sys
from importlib.abc import MetaPathFinder

SERVER = {"torch", "ray", "fastapi", "starlette", "uvicorn", "numpy", "psutil", "boto3",
          "botocore", "prometheus_client", "torchft", "pandas", "pyarrow", "tokenizers",
          "safetensors"}


class _NotInstalled(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # the finder protocol's signature
        if name.split(".")[0] in SERVER:
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
