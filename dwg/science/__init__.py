"""The science of dynamic weight grafting: the facts and models, the plans and their scores, the verdicts on the paper's
claims, and the pictures and reports that show them."""
