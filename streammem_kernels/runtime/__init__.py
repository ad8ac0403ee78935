"""The shared runtime of the ops: backend dispatch (``dispatch``), loading and calling native modules
(``native``: the C++ border; ``cuda``: the CUDA libraries), argument validation (``validate``) and
Triton launch configuration (``launch``), plus the developer tools that check the kernels without a
GPU (``aot``, ``cuda_build``).  Ops import these; nothing here imports an op statically (the backend
report and the CUDA loader find the op folders by listing the package).
"""
