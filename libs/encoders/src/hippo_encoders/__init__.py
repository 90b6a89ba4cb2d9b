"""Sentence encoders: the model specs, the ONNX and torch backends, the dynamic-int8
conversion of the built-in graph, and their settings. The embedding service serves them;
the gateway loads the same default model to embed a lone Recall's query itself. A
library, so that neither service imports the other."""
