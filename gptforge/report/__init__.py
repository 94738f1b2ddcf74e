"""HTML run report with plots."""
