"""Redis and RQ, the only state the API and the workers share: the job queue and session store."""
