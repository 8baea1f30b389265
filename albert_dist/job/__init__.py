"""A job's life on a rank: stop signals, the run lock, the console and the one logging set-up."""
