"""The repository's kernels/ must never shadow Hugging Face's ``kernels`` distribution, which
transformers imports (>= 5.25); ours is imported as ``eagle_kernels``."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_kernels_dir_is_not_a_regular_package():
    # a kernels/__init__.py would make the checkout's kernels/ win over any installed `kernels`
    # whenever the root is on sys.path (`python -m pytest`, `python -c` from the root)
    assert not (ROOT / "kernels" / "__init__.py").exists()


def test_installed_kernels_distribution_wins_from_the_repository_root(tmp_path):
    # a stand-in for Hugging Face's distribution, on sys.path right after the root ('' for -c), before
    # site-packages (where the real one may be installed)
    fake = tmp_path / "site" / "kernels"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("CUDAProperties = 'hf'\n")
    code = ("import sys; assert sys.path[0] == ''; sys.path.insert(1, sys.argv[1]); "
            "from kernels import CUDAProperties; import eagle_kernels.cpu_gemm as c, eagle_kernels.tree_attention as t; "
            "print(CUDAProperties); print(c.__file__); print(t.__file__)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    mark, gemm, attn = out.stdout.split()
    assert mark == "hf"
    assert Path(gemm).resolve().parent == ROOT / "kernels" and Path(attn).resolve().parent == ROOT / "kernels"
