"""The run report: one self-contained HTML page of what a run did (page.write_report)."""
