"""What operators see of the plugin: feature states and the status API."""
