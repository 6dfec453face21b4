"""The register study: no-CLS twins without / with registers trained on digit canvases, with the
artifact metrics tracked through training (``vit5 viz study``)."""
