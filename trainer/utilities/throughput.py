"""Lightning's ``lightning.fabric.utilities.throughput`` names: ``Throughput``, ``measure_flops``,
``get_available_flops`` (defined in ``engine.throughput``, re-exported here where a ported import looks).

Example:
    >>> from trainer.utilities.throughput import Throughput, measure_flops
    >>> Throughput(window_size=4).separator
    '/'
"""

from engine.throughput import Throughput, get_available_flops, measure_flops

__all__ = ["Throughput", "get_available_flops", "measure_flops"]
