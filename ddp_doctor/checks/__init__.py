"""The check catalogue, one module per concern. Importing a module registers its checks;
`ddp_doctor.registry.load_catalogue()` imports them all."""
