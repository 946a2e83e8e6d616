"""Pictures and reports: the paper's figures as charts, the regime chart, localisation plots, and the one-page report."""
