"""From coursekit to production: the course's algorithms beside the libraries that replace them.

Chapter 09 runs each pair on the same engines and asserts they compute the same thing:

- :mod:`.requirement`: PyTorch is the ``torch`` extra; without it the chapter says so in one
  line and skips its cells (never a traceback).
- :mod:`.torch_group`: torch.distributed's process group on the ranks of a course Comm
  (gloo on CPU, NCCL where every rank has a GPU), torn down when the experiment ends.
- :mod:`.mpi_collectives`: MPI's own collectives beside the course's over MpiComm and ZmqComm.
- :mod:`.ddp`: DistributedDataParallel (and its gradient buckets) beside chapter 3's SGD.
- :mod:`.zero_fsdp`: ZeroRedundancyOptimizer and FSDP2 beside chapter 8's ZeRO stages;
  :mod:`.c10d_log` counts the bytes of torch's collectives.
- :mod:`.pipelining`: torch.distributed.pipelining's GPipe and 1F1B beside chapter 5's.
- :mod:`.powersgd_hook`: DDP's PowerSGD hook beside chapter 6's PowerSGD.
- :mod:`.porting`: chapter 3's training script and its DDP port, run as torchrun would.
- :mod:`.torch_mlp` (``nn.Linear``, as a user writes it) and :mod:`.course_mlp` (the
  course's W layout, so a hook sees the course's gradient matrices): the course's MLP in torch.
- :mod:`.side_by_side`: each comparison reduced to one row, for chapter 09's panel.
"""
