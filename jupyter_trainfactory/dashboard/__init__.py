"""Live job dashboard: a pure model (:mod:`.model`) and its ipywidgets/bokeh view (:mod:`.widget`)."""

from .model import DashboardModel, RunSource, Snapshot
from .widget import JobDashboard

__all__ = ["DashboardModel", "JobDashboard", "RunSource", "Snapshot"]
