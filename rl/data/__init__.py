"""Problems to train on: loaders, filters and the scripted demonstrations for SFT."""
