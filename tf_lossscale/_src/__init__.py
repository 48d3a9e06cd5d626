"""Private implementation of tf_lossscale; import the public namespaces instead."""
