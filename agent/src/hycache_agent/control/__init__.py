"""The control link: the agent's link to the control plane, and its local control socket."""
