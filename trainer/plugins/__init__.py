"""Lightning's ``plugins=``: the cluster environments (``trainer.plugins.environments``).

``Trainer(plugins=[SLURMEnvironment(auto_requeue=True)])`` ports from ``lightning.pytorch.plugins``; precision and
checkpoint-I/O plugins are not taken (``precision=`` sets precision, and checkpoints are Ember's own).
"""

from trainer.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)

__all__ = ["ClusterEnvironment", "LightningEnvironment", "SLURMEnvironment", "TorchElasticEnvironment"]
