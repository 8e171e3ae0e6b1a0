"""The Accelerator's experiment-tracking API (``init_trackers``, ``log``, ``get_tracker``, ``end_training``)."""

from __future__ import annotations

from typing import Any

from engine.tracking.hub import TrackerHub


class TrackingMixin:
    """Trackers run on the main process only (unless a tracker says otherwise); other ranks get no-ops."""

    _tracker_hub: TrackerHub

    def _init_tracking(self, log_with: Any) -> None:
        self.log_with = log_with
        self._tracker_hub = TrackerHub(log_with, self.logging_dir, self.is_main_process)  # type: ignore[attr-defined]

    def init_trackers(self, project_name: str, config: dict[str, Any] | None = None,
                      init_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Start every tracker for ``project_name`` and store ``config`` as the run configuration."""
        self._tracker_hub.init(project_name, config=config, init_kwargs=init_kwargs)

    def log(self, values: dict[str, Any], step: int | None = None,
            log_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Log ``values`` at ``step`` to every tracker (``log_kwargs[tracker_name]`` passed through)."""
        self._tracker_hub.log(values, step=step, log_kwargs=log_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its raw run object with ``unwrap``); a blank tracker on other ranks."""
        return self._tracker_hub.get(name, unwrap=unwrap)

    @property
    def trackers(self) -> list[Any]:
        return self._tracker_hub.trackers

    def end_training(self) -> None:
        """Wait for an asynchronous checkpoint in flight, finish every tracker, then destroy the process group
        (no collective may run after this). A group made by other code and adopted (Ray Train's, the user's own
        ``init_process_group``) is left to its owner, unlike Accelerate: Ray's shutdown still needs it."""
        try:
            self.wait_for_checkpoint()  # type: ignore[attr-defined]
        finally:
            self._tracker_hub.finish()
            if not self.state.adopted_process_group:  # type: ignore[attr-defined]
                self.state.destroy_process_group()  # type: ignore[attr-defined]

    def finish_trackers(self) -> None:
        """Finish every tracker but keep the process group (``end_training`` does both); safe to call twice."""
        self._tracker_hub.finish()

    def tracker_state_dict(self) -> dict[str, dict[str, Any]]:
        """The trackers' run identities by tracker name (JSON-able), to store in a checkpoint.

        Empty on ranks that run no tracker. Pass it to ``load_tracker_state_dict`` in the resumed process.
        """
        return self._tracker_hub.state_dict()

    def load_tracker_state_dict(self, states: dict[str, dict[str, Any]]) -> None:
        """Continue the runs ``tracker_state_dict`` named; call before ``init_trackers`` (it raises after)."""
        self._tracker_hub.load_state_dict(states)
