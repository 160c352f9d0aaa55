"""``python -m avex.train``: train the AVEX policy (:mod:`avex.training.loop` does the work).

``from avex.train import train, TrainConfig`` is the Python way in: ``train(TrainConfig(...))``
is the run that ``python -m avex.train`` makes from its flags. The training modules are in
:mod:`avex.training`.
"""
import sys

from avex.training.config import TrainConfig
from avex.training.loop import ensure_trained, main, train, train_variant

__all__ = ["TrainConfig", "ensure_trained", "main", "train", "train_variant"]

if __name__ == "__main__":
    from avex.heap import keep_freed_memory

    try:   # the command's own process: see avex/heap.py
        keep_freed_memory()
    except ValueError as err:   # before any work, as a usage error
        print(f"python -m avex.train: error: {err}", file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1:])
