"""Services: the control plane's logic.  Routes call these; these use the models and the DHT."""
