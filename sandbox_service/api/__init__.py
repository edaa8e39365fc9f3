"""The API process: FastAPI app, admission, dispatch to the queue and awaiting of results."""
