"""What runyard-client and the service say to each other: the bodies of the workers'
reports and the service's answers (schemas.py), and which protocol versions the service
speaks (handshake.py). The workers' API (service/workers/) acts on them; the run API checks
an entrypoint's runyard-client against the same versions at submission."""
