"""From coursekit to production: the course's algorithms beside the libraries that replace them.

- :mod:`.requirement`: PyTorch is the ``torch`` extra; without it the chapter says so in one
  line and skips its cells (never a traceback).
- :mod:`.torch_group`: torch.distributed's process group on the ranks of a course Comm
  (gloo on CPU, NCCL where every rank has a GPU), torn down when the experiment ends.
"""
