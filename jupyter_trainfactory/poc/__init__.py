"""``%train poc``: prove a cluster before trusting it (issue 19).

:func:`~.run.poc` runs the stages as one job and writes the report; :mod:`.checks`
judges the figures (pure), :mod:`.thresholds` reads the bounds, :mod:`.report` and
:mod:`.html` show them.
"""
