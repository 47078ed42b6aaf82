"""Local stand-ins for services that cannot run here, speaking their real wire protocols."""
