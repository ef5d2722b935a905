"""What a run is asked about: workloads, objectives, the model file and its facts."""
