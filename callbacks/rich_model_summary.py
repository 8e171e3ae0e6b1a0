"""`RichModelSummary`: the ``ModelSummary`` table drawn with rich (Lightning's callback of that name).

rich is optional (``pip install rich``): it is imported when a summary is printed, never by ``import callbacks``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch

from callbacks.model_summary import ModelSummary, human_count, parameter_totals, summarized_layers
from callbacks.protocols import TrainerView

# Columns whose cells are numbers or shapes: right-aligned, as Lightning draws them.
_RIGHT = frozenset({"Params", "FLOPs", "In sizes", "Out sizes"})


def __getattr__(name: str) -> Any:
    if name == "_RICH_AVAILABLE":  # Lightning's flag; a test may set it False to see the missing-rich error
        return importlib.util.find_spec("rich") is not None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RichModelSummary(ModelSummary):
    """``ModelSummary`` as a rich table (Name, Type, Params, Mode) and the parameter totals under it, printed on
    the main process when fit starts. ``Trainer(callbacks=RichProgressBar())`` adds it in place of the default
    ``ModelSummary``, as Lightning does.

    Args:
        max_depth: layers nested this deep are listed (-1: all; 0: no summary).
        **summarize_kwargs: styles of the table: ``header_style`` (default ``"bold magenta"``), ``title``,
            ``title_style``, ``title_justify``, ``box``, ... (any ``rich.table.Table`` argument).

    Example:
        >>> RichModelSummary(max_depth=2, header_style="bold").summarize_kwargs
        {'header_style': 'bold'}
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        if not importlib.import_module(__name__)._RICH_AVAILABLE:
            raise ModuleNotFoundError("`RichModelSummary` requires `rich` to be installed. Install it by running "
                                      "`pip install -U rich` (or `pip install ember-train[rich]`).")
        super().__init__(max_depth=max_depth)
        self.summarize_kwargs = summarize_kwargs

    def on_fit_start(self, trainer: TrainerView, pl_module: torch.nn.Module) -> None:
        if trainer.is_global_zero and self.max_depth != 0:
            layers = summarized_layers(pl_module, self.max_depth)
            summary_data = [(" ", [str(i) for i in range(len(layers))]),
                            ("Name", [name for name, _ in layers]),
                            ("Type", [type(layer).__name__ for _, layer in layers]),
                            ("Params", [human_count(sum(p.numel() for p in layer.parameters())) for _, layer in layers]),
                            ("Mode", ["train" if layer.training else "eval" for _, layer in layers])]
            submodules = list(pl_module.modules())[1:]
            modes = {"train": sum(m.training for m in submodules), "eval": sum(not m.training for m in submodules)}
            trainable, total, size_mb = parameter_totals(pl_module)
            self.summarize(summary_data, total, trainable, size_mb, modes, None, **self.summarize_kwargs)

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int | None,
                  **summarize_kwargs: Any) -> None:
        """Print the table (one column per ``(header, cells)`` of ``summary_data``) and the totals, on rich's
        console; Lightning's signature. ``total_flops=None`` (Ember counts no FLOPs) leaves its line out."""
        import rich
        from rich.table import Table

        console = rich.get_console()  # looked up here: a test (or a notebook) may swap rich's console
        table = Table(**{"header_style": "bold magenta", **summarize_kwargs})
        for header, _ in summary_data:
            if header == " ":
                table.add_column(header, style="dim")
            elif header == "Name":
                table.add_column(header, justify="left", no_wrap=True)
            else:
                table.add_column(header, justify="right" if header in _RIGHT else "left")
        for row in zip(*(cells for _, cells in summary_data)):
            table.add_row(*row)
        console.print(table)

        lines = [f"[bold]Trainable params[/]: {human_count(trainable_parameters)}",
                 f"[bold]Non-trainable params[/]: {human_count(total_parameters - trainable_parameters)}",
                 f"[bold]Total params[/]: {human_count(total_parameters)}",
                 f"[bold]Total estimated model params size (MB)[/]: {model_size:,.3f}",
                 f"[bold]Modules in train mode[/]: {total_training_modes.get('train', 0)}",
                 f"[bold]Modules in eval mode[/]: {total_training_modes.get('eval', 0)}"]
        if total_flops is not None:
            lines.append(f"[bold]Total FLOPs[/]: {human_count(total_flops)}")
        grid = Table.grid(expand=True)
        grid.add_column()
        for line in lines:
            grid.add_row(line)
        console.print(grid)
