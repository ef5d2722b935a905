"""One isolated measurement: the records it produces, the runner that launches the child, the child itself."""
