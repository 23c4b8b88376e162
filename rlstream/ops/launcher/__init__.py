"""`rlstream run`: the launcher of the streaming loop, its live view and its report."""
