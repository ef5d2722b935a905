"""What a run hands the user: the recommendation document, summary figures, export, report, compare, check."""
