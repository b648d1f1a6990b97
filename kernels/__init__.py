"""Custom kernels (Triton) used by the verifier and the draft heads.

Import from the submodules, e.g. ``from kernels.tree_attention import tree_attention``. Nothing is
imported here, so that ``TRITON_INTERPRET`` can still be set after ``import kernels``: triton reads it
when it is first imported (see docs/kernels.md).
"""
