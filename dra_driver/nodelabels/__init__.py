"""Node labels in GPU Feature Discovery's vocabulary (``nvidia.com/gpu.product``, ...).

:mod:`values` turns names and versions into valid label values, :mod:`compute` computes a node's
label set from the device model (pure, no Kubernetes client), :mod:`reconcile` keeps the Node's
labels equal to that set through the API port, and :mod:`agent` starts it inside a node agent.
"""
