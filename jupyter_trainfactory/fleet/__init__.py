"""The fleet's reliability: failure kinds, the failure log of a run, and the report over runs
(``trainfactory.reliability``; named ``fleet`` so that the package attribute
``jupyter_trainfactory.reliability`` stays the API function once this is imported)."""
