"""What the measurements mean: figures, tables and comparisons computed from results/ only.

- :mod:`analysis.load`: read and check runs (``results/<run-id>/`` rows.csv + meta.json) into
  one table;
- :mod:`analysis.stats`: throughput, cost per item, medians with spread, ratios;
- :mod:`analysis.plots`: one module per figure, each a pure function of the table;
- :mod:`analysis.render`: draw every figure into PNG + SVG + the CSV behind it;
- :mod:`analysis.claims`: the papers' claims as data (paper, number, suites, verdict rule);
- :mod:`analysis.findings`: the findings page (claims table, hosts, which design when) from them;
- :mod:`analysis.headline`: one headline figure per claim and host, the paper's number marked;
- :mod:`analysis.report`: analysis/REPORT.md (the findings) and analysis/report/<host>.md (one
  page per host, ordered by claim); :mod:`analysis.compare`: two runs side by side;
- :mod:`analysis.palette`: one colour per variant across every figure.

Command line: ``replaybench plots | report | compare`` (``make plots``, ``make report``).
"""
